"""Greedy generation with ONNX Runtime GenAI, and the identity rewrite, for the GenAI folder tests.

``generate_greedy(folder, prompts, steps)`` is the comparison every GenAI test makes: the same
prompts through two folders must give the same tokens and (to a tolerance) the same logits.
"""
from __future__ import annotations

import numpy as np


def generate_greedy(folder, prompts: list[str], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``steps`` tokens greedily for each prompt (one batch, left-padded by GenAI's
    tokenizer) with the GenAI folder's model: the new tokens (B, steps) and the logits each
    step chose from (steps, B, vocab). EOS is held off (min_length) so every run has ``steps``."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode_batch(prompts).as_numpy() if len(prompts) > 1 else \
        np.asarray(tokenizer.encode(prompts[0]), dtype=np.int32).reshape(1, -1)
    length = ids.shape[1] + steps
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, top_k=1, max_length=length, min_length=length,
                              batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    logits = []
    for _ in range(steps):
        logits.append(np.array(generator.get_logits())[:, -1, :])
        generator.generate_next_token()
    tokens = np.stack([np.asarray(generator.get_sequence(b))[-steps:] for b in range(len(prompts))])
    return tokens, np.stack(logits)


def write_identity(source_model):
    """A ``write_model`` for ``ort_flash.genai.write_folder`` that writes ``source_model`` back
    unchanged, through onnx, with its weights in ``<name>.data`` beside it."""
    import onnx

    def write(path):
        model = onnx.load(str(source_model))
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=0)
    return write
