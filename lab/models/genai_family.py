"""Tiny random Hugging Face LLMs built into ONNX Runtime GenAI folders by GenAI's model builder.

    from lab.models.genai_family import FAMILIES, build
    folder = build("llama")      # a GenAI folder: model.onnx(.data), genai_config.json, tokenizer

Each family is a config written here (two layers, hidden 128, 4 query / 2 KV heads, a small
vocabulary), random weights from ``torch.manual_seed(0)``, and a ``tokenizers`` byte-level BPE
tokenizer trained on the words of ``WORDS``; ``save_pretrained`` writes the Hugging Face folder and
``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu`` builds it, with no
network. Every attention layer of the result is one ``com.microsoft.GroupQueryAttention``.

Built folders are cached beside the other model exports (``lab.models.families.cache_dir()/genai``)
in one folder per family, keyed by the config and the versions of the builder's inputs, and
written atomically (built in a scratch folder, then renamed).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from lab.models.families import ExportFailure, cache_dir  # noqa: E402

SEED = 0
REVISION = 1  # bump when the folder this file writes changes in a way the key does not show
TIMEOUT = 900  # seconds for one builder run
# The random weights come from torch's global generator: threads that build families at once
# (builder runs are subprocesses) seed and draw them one family at a time.
_WEIGHTS_LOCK = threading.Lock()

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
# The tokenizer's training text: each word becomes one token.
WORDS = ("the a an one two three red green blue cat dog bird fish tree house river stone cloud "
         "runs sees eats likes finds makes big small old new fast slow and or but with on in "
         "under over near far up down left right day night sun moon rain snow wind fire water "
         "earth light dark warm cold happy sad loud quiet").split()
UNK, BOS, EOS, PAD = 0, 1, 2, 3

# Shared by every family: GQA with 4 query and 2 KV heads of dim 32.
_COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               rope_theta=10000.0, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
               tie_word_embeddings=False)

# Mistral's and Gemma 2's windows are shorter than the tests' prompts plus 32 generated tokens,
# so the window changes the result.
WINDOW = 8

# family -> (transformers config class, model class, architecture, config arguments,
#            builder --extra_options)
FAMILIES: dict[str, tuple[str, str, str, dict, tuple[str, ...]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaForCausalLM", dict(_COMMON), ()),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForCausalLM",
              dict(_COMMON, use_sliding_window=False), ()),
    # GenAI's builder (0.18.0) windows only the layers that layer_types marks: without it every
    # Mistral layer gets local_window_size -1 although Hugging Face's Mistral slides them all.
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralForCausalLM",
                dict(_COMMON, sliding_window=WINDOW, layer_types=["sliding_attention"] * 2), ()),
    # The builder takes Phi3ForCausalLM without LongRoPE only when the two lengths agree.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "Phi3ForCausalLM",
             dict(_COMMON, original_max_position_embeddings=256, sliding_window=None), ()),
    # Gemma 2: soft-capped attention logits and final logits, a window on alternate layers.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "Gemma2ForCausalLM",
               dict(_COMMON, head_dim=32, query_pre_attn_scalar=32, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention"],
                    tie_word_embeddings=True), ()),
    # Qwen3: per-head RMS norms of Q and K before the rotary (a CUDA build fuses them into
    # GroupQueryAttention as q_norm_weight / k_norm_weight).
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForCausalLM", dict(_COMMON, head_dim=32), ()),
}
# gpt-oss: attention sinks (a learned logit per head, GQA's head_sink), a window on alternate
# layers (the builder windows the even ones, as layer_types does here), biased projections, YaRN
# rotary, and a mixture of experts (4 experts, 2 a token) that the builder writes as one MoE op.
FAMILIES["gptoss"] = ("GptOssConfig", "GptOssForCausalLM", "GptOssForCausalLM",
                      dict(_COMMON, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                           sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                           max_position_embeddings=2048,
                           rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                original_max_position_embeddings=512,
                                                beta_fast=32.0, beta_slow=1.0, truncate=False)), ())
# By default the builder gives a windowed layer a window-sized KV cache (GQA attribute
# sliding_window_cache=1); these variants keep the max_length-sized cache of the other layers.
for _name in ("mistral", "gemma2"):
    FAMILIES[f"{_name}-fullkv"] = FAMILIES[_name][:4] + (("windowed_kv_cache=false",),)
# Families whose windowed layers have window-sized KV caches.
WINDOWED_KV = ("mistral", "gemma2", "gptoss")

# LongRoPE as Phi-3's checkpoints write it ("type" beside "rope_type": the builder reads "type").
_LONGROPE = dict(rope_type="longrope", type="longrope", rope_theta=10000.0,
                 short_factor=[1.0 + i / 16 for i in range(16)], long_factor=[1.0 + i / 4 for i in range(16)])
# A multimodal model's text decoder: its vision tower as small as its config allows (the builder
# exports the text decoder alone, model type "<name>_text").
_QWEN_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128)
# Qwen 3.5's rotary as its checkpoints write it: a quarter of each head (8 of 32 here), MRoPE with
# interleaved time / height / width sections (the builder writes MRotaryEmbedding only where
# mrope_section is given; without it, a RotaryEmbedding fed the 3-D position_ids, which ONNX Runtime
# refuses).
_QWEN3_5_ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                     mrope_section=[2, 1, 1], mrope_interleaved=True)
_QWEN3_5_TEXT = dict(_COMMON, head_dim=32, layer_types=["linear_attention", "full_attention"],
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                     linear_value_head_dim=32, rope_parameters=_QWEN3_5_ROPE)
# Gemma 4: Q/K norms and a window on alternate layers, wider heads on the full layers
# (global_head_dim); Gemma 4's MoE model adds per-layer input embeddings and experts beside each
# layer's MLP.
_GEMMA4_TEXT = dict(_COMMON, head_dim=32, global_head_dim=64, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention"])
# The builder's other text decoders, each for what its attention brings; test_genai_fidelity.py
# checks those the builder (0.18.0, under transformers 5) builds, test_genai.py's sweep leaves them
# out for CI's time. It refuses gemma3, gemma4, gemma4_unified, phimoe and smollm3 (build raises
# ExportFailure with its message; tests/test_genai_fidelity.py's EXTRA_BUILT says why).
EXTRA: dict[str, tuple[str, str, str, dict, tuple[str, ...]]] = {
    # Gemma: the embeddings scaled by sqrt(hidden), RMS norms of weight + 1; plain attention.
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "GemmaForCausalLM", dict(_COMMON, head_dim=32), ()),
    # Gemma 3: Q/K norms, a window on alternate layers with its own rotary base (two rotary tables).
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3ForCausalLM",
               dict(_COMMON, head_dim=32, query_pre_attn_scalar=32, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                                         full_attention=dict(rope_type="default", rope_theta=1e6))), ()),
    # Granite: an attention multiplier as the softmax scale (not 1/sqrt(head size)), multipliers on
    # the embeddings, the residuals and the logits.
    "granite": ("GraniteConfig", "GraniteForCausalLM", "GraniteForCausalLM",
                dict(_COMMON, attention_multiplier=0.25, embedding_multiplier=12.0,
                     residual_multiplier=0.5, logits_scaling=4.0), ()),
    # Granite 4 with attention layers only (the builder writes no Mamba layer) and a shared MLP:
    # Granite's multipliers. The builder rotates whatever position_embedding_type says (its NoPE
    # checkpoints included), so this one asks for the rotary.
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", "GraniteMoeHybridForCausalLM",
                         dict(_COMMON, layer_types=["attention", "attention"], num_local_experts=0,
                              position_embedding_type="rope",
                              shared_intermediate_size=256, attention_multiplier=0.25,
                              embedding_multiplier=12.0, residual_multiplier=0.5, logits_scaling=4.0), ()),
    # HunYuan dense: Q/K norms after the rotary, so the builder keeps RotaryEmbedding outside the
    # attention (GQA without do_rotary).
    "hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1ForCausalLM",
                dict(_COMMON, head_dim=32), ()),
    # ERNIE 4.5: interleaved rotary (rotary_interleaved=1).
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", "Ernie4_5ForCausalLM", dict(_COMMON, head_dim=32), ()),
    # LFM2: a short-convolution layer (a conv state, no KV cache) then an attention layer with Q/K norms.
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", "Lfm2ForCausalLM",
             dict(_COMMON, layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False), ()),
    # Nemotron: partial rotary (half of each head), LayerNorm of weight + 1, a squared-ReLU MLP.
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", "NemotronForCausalLM",
                 dict(_COMMON, head_dim=32, partial_rotary_factor=0.5), ()),
    # OLMo: LayerNorm without weights; plain attention.
    "olmo": ("OlmoConfig", "OlmoForCausalLM", "OlmoForCausalLM", dict(_COMMON), ()),
    # Phi-2: partial rotary (half of each head), biased projections, attention and MLP in parallel.
    "phi": ("PhiConfig", "PhiForCausalLM", "PhiForCausalLM", dict(_COMMON, partial_rotary_factor=0.5), ()),
    # Phi-3 with LongRoPE: two rotary tables (short and long factors) chosen by the sequence length.
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM", "Phi3ForCausalLM",
                      dict(_COMMON, max_position_embeddings=512, original_max_position_embeddings=256,
                           sliding_window=None, rope_parameters=_LONGROPE), ()),
    # Phi-3.5-MoE: Phi-3's LongRoPE and experts, under the architecture name of its checkpoints;
    # the builder writes it for CUDA in int4 only.
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", "PhiMoEForCausalLM",
               dict(_COMMON, max_position_embeddings=512, original_max_position_embeddings=256,
                    num_local_experts=4, num_experts_per_tok=2,
                    rope_parameters=dict(_LONGROPE, short_mscale=1.2, long_mscale=1.2,
                                         original_max_position_embeddings=256)), ()),
    # SmolLM3: NoPE on every fourth layer (here layer 1: no rotary there).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", "SmolLM3ForCausalLM",
                dict(_COMMON, no_rope_layers=[1, 0], layer_types=["full_attention"] * 2), ()),
    # LFM2-MoE: LFM2's layers (a convolution layer, an attention layer with Q/K norms), experts after
    # the first (dense) layer: a sigmoid router with a selection bias, the choice made in the graph
    # and fed to one com.microsoft MoE op.
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", "Lfm2MoeForCausalLM",
                 dict(_COMMON, layer_types=["conv", "full_attention"], num_dense_layers=1, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=64), ()),
    # Qwen 3.5's text decoder: a linear-attention layer (gated delta rule: a convolution state and a
    # recurrent state, no KV cache) then a full-attention layer with Q/K norms, partial interleaved
    # MRoPE outside the attention (3-D position_ids) and a sigmoid gate on its output.
    "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                dict(text_config=_QWEN3_5_TEXT, vision_config=_QWEN_VISION, tie_word_embeddings=False), ()),
    # Qwen 3.5 MoE: Qwen 3.5's layers with experts and a gated shared expert.
    "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                    dict(text_config=dict(_QWEN3_5_TEXT, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=64, shared_expert_intermediate_size=64),
                         vision_config=_QWEN_VISION, tie_word_embeddings=False), ()),
    # Mistral 3 (Mistral Small 3.1's layout): a Mistral text decoder without a window; the builder
    # loads the whole VLM (a one-layer Pixtral tower here).
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration", "Mistral3ForConditionalGeneration",
                 dict(text_config=dict(_COMMON, head_dim=32, model_type="mistral", sliding_window=None),
                      vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, head_dim=16, image_size=56, patch_size=14),
                      tie_word_embeddings=False), ()),
    # Qwen2.5-VL's text decoder: Qwen 2 attention, MRoPE in sections outside the attention (3-D
    # position_ids; a text prompt gives each section the same index).
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                   dict(text_config=dict(_COMMON, rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                       mrope_section=[4, 6, 6])),
                        vision_config=dict(_QWEN_VISION, fullatt_block_indexes=[0]), tie_word_embeddings=False), ()),
    # Qwen3-VL's text decoder: Q/K norms, interleaved MRoPE outside the attention.
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
                 dict(text_config=dict(_COMMON, head_dim=32,
                                       rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                            mrope_section=[8, 4, 4], mrope_interleaved=True)),
                      vision_config=dict(_QWEN_VISION, deepstack_visual_indexes=[]), tie_word_embeddings=False), ()),
    # LFM2-VL's text decoder: LFM2's.
    "lfm2_vl": ("Lfm2VlConfig", "Lfm2VlForConditionalGeneration", "Lfm2VlForConditionalGeneration",
                dict(text_config=dict(_COMMON, model_type="lfm2", layer_types=["conv", "full_attention"],
                                      block_auto_adjust_ff_dim=False),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_patches=16),
                     projector_hidden_size=32, tie_word_embeddings=False), ()),
    # Gemma 4 (its MoE model) and Gemma 4 Unified (dense): see _GEMMA4_TEXT.
    "gemma4": ("Gemma4Config", "Gemma4ForConditionalGeneration", "Gemma4ForConditionalGeneration",
               dict(text_config=dict(_GEMMA4_TEXT, vocab_size_per_layer_input=256, hidden_size_per_layer_input=16,
                                     enable_moe_block=True, num_experts=4, top_k_experts=2,
                                     moe_intermediate_size=64)), ()),
    "gemma4_unified": ("Gemma4UnifiedConfig", "Gemma4UnifiedForConditionalGeneration",
                       "Gemma4UnifiedForConditionalGeneration", dict(text_config=_GEMMA4_TEXT), ()),
}
FAMILIES.update(EXTRA)


def cache_key(family: str, precision: str = "fp32", ep: str = "cpu") -> str:
    import onnxruntime_genai
    import tokenizers
    import torch
    import transformers

    recipe = dict(family=family, config=FAMILIES[family], words=WORDS, seed=SEED, revision=REVISION,
                  builder=onnxruntime_genai.__version__, torch=torch.__version__,
                  transformers=transformers.__version__, tokenizers=tokenizers.__version__)
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    build_kind = "" if (precision, ep) == ("fp32", "cpu") else f"-{precision}-{ep}"
    return f"genai-{family}{build_kind}-{digest}"


def build(family: str, *, precision: str = "fp32", ep: str = "cpu", refresh: bool = False) -> pathlib.Path:
    """The GenAI folder of ``family``, built by GenAI's model builder unless the cache holds it:
    ``-p precision -e ep`` (fp32 for the CPU EP by default; fp16 / bf16 with ``ep="cuda"`` build
    what a CUDA user deploys, which needs onnxruntime-genai-cuda and a GPU).

    Raises ExportFailure (cached as a ``.failed`` file with the builder's message) when the
    builder refuses the family, so a refusal is not retried on every run."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {sorted(FAMILIES)}")
    root = cache_dir() / "genai"
    key = cache_key(family, precision, ep)
    target, failed = root / key, root / f"{key}.failed"
    if not refresh:
        if (target / "genai_config.json").is_file():
            return target
        if failed.is_file():
            raise ExportFailure(failed.read_text())
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{key}-") as scratch:
        scratch = pathlib.Path(scratch)
        hf = scratch / "hf"
        with _WEIGHTS_LOCK:
            save_hf_folder(family, hf)
        out = scratch / "out"
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
               "-p", precision, "-e", ep, "-c", str(scratch / "cache")]
        if FAMILIES[family][4]:
            cmd += ["--extra_options", *FAMILIES[family][4]]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=scratch)
        if run.returncode != 0 or not (out / "genai_config.json").is_file():
            message = f"builder failed for {family} (rc {run.returncode}):\n{run.stderr[-4000:]}"
            failed.write_text(message)
            raise ExportFailure(message)
        if refresh and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(out, target)
        except OSError:  # another process built it first
            if not (target / "genai_config.json").is_file():
                raise
    failed.unlink(missing_ok=True)
    return target


def save_hf_folder(family: str, folder: pathlib.Path) -> None:
    """Write ``family``'s random model and the tokenizer as a Hugging Face folder."""
    import torch
    import transformers

    config_class, model_class, arch, kwargs, _ = FAMILIES[family]
    vocab_size = save_tokenizer(folder)
    if "text_config" in kwargs:  # a multimodal model's config: the vocabulary is its text model's
        kwargs = dict(kwargs, text_config=dict(kwargs["text_config"], vocab_size=vocab_size))
    else:
        kwargs = dict(kwargs, vocab_size=vocab_size)
    config = getattr(transformers, config_class)(**kwargs)
    config.architectures = [arch]
    torch.manual_seed(SEED)
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(folder)
    if arch != model_class:  # save_pretrained writes the class name; the checkpoints name `arch`
        path = folder / "config.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), architectures=[arch]), indent=2))


def save_tokenizer(folder: pathlib.Path) -> int:
    """A byte-level BPE tokenizer trained on WORDS (a word is one token, with or without its
    leading space), saved as tokenizer.json and tokenizer_config.json; returns its vocabulary
    size. GenAI's tokenizer reads BPE (vocabulary and merges), not a WordLevel model: one fails
    with "Cannot know how to parse line"."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator([" ".join(WORDS)] * 4 + [" " + w for w in WORDS], trainer)
    assert [tok.token_to_id(t) for t in SPECIALS] == [UNK, BOS, EOS, PAD]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(folder)
    # transformers 5 writes "TokenizersBackend", a class name GenAI's tokenizer does not know.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()


if __name__ == "__main__":
    for name in sys.argv[1:] or FAMILIES:
        try:
            print(name, build(name))
        except ExportFailure as e:
            print(name, "FAILED", str(e).splitlines()[-1])
