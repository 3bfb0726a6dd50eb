"""One decode row of the genai suite again, in a process of its own, with a float32 reference:
where the greedy tokens of the original and the rewritten folder part, which of the two is off?

The prompt is the one the suite drew for that row (its random ids, drawn in the suite's grid
order from the same seed), so a row of a full-grid run is replayed without the rows before it.

1. The suite's own path (``genai_e2e.Runner``): the prompt appended, ``rounds + 1`` rounds of
   ``steps`` decode steps with ``rewind_to(context)`` between them, then the replay with logits.
   Printed: each round's first tokens, where the two variants part.
2. Teacher-forced through GenAI (``genai_fidelity.GenAIDriver``): the prompt, then ``--fed``
   tokens (the original's greedy choices) one a step; each variant's logits at every step.
3. The reference: the Hugging Face folder GenAI's builder read (the same random weights) in
   float32 torch (TF32 off, SDPA's memory-efficient kernel), fed the same tokens; its logits at
   the same positions. Each variant's max |logits - reference| per step is the verdict: a
   variant that computes the model stays within fp16's rounding of it (about 1e-2 here), the one
   that does not is off by far more.
   Path 1's replayed logits are matched against the reference on that variant's own sequence
   (GenAI's steps after a rewind do not line up with positions one for one, so each replayed row
   is compared with the reference row it is closest to, and the offset is printed).

  python lab/experiments/genai_case.py --context 32768 --out /tmp/out/genai-case.json

Needs onnxruntime-genai-cuda, onnxruntime-gpu, torch and transformers; builds the suite's folders
into --cache-dir when absent (GenAI's builder, about 30 s).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from ort_flash.bench import genai_e2e, genai_fidelity  # noqa: E402


def suite_prompt(g: dict, context: int, seed: int) -> np.ndarray:
    """The ids the genai suite draws for its decode row at ``context`` (genai_e2e.run's order)."""
    rng = np.random.default_rng(seed)
    for kind, n in [("ttft", p) for p in g["prompts"]] + [("decode", c) for c in g["contexts"]]:
        ids = rng.integers(3, g["vocab"], n).astype(np.int32)
        if kind == "decode" and n == context:
            return ids
    raise SystemExit(f"the grid has no decode row at {context}: contexts {g['contexts']}")


class Reference:
    """The HF folder in float32 torch: logits of the last ``rows`` positions of a sequence."""

    def __init__(self, folder: pathlib.Path, device: str):
        import torch
        import transformers

        try:  # K/V repeated to the query heads: SDPA's memory-efficient kernel takes no enable_gqa
            import transformers.integrations.sdpa_attention as sdpa_attention

            if hasattr(sdpa_attention, "use_gqa_in_sdpa"):
                sdpa_attention.use_gqa_in_sdpa = lambda *a, **k: False
        except ImportError:
            pass
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.torch, self.device = torch, device
        self.model = transformers.LlamaForCausalLM.from_pretrained(
            folder, torch_dtype=torch.float32, attn_implementation="sdpa").to(device).eval()

    def logits(self, ids: np.ndarray, rows: int) -> np.ndarray:
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        x = torch.as_tensor(np.asarray(ids, np.int64), device=self.device)[None]
        kernels = [SDPBackend.EFFICIENT_ATTENTION] if self.device == "cuda" else [SDPBackend.MATH]
        with torch.no_grad(), sdpa_kernel(kernels):
            h = self.model.model(input_ids=x).last_hidden_state[0, -rows:]
            out = self.model.lm_head(h).float().cpu().numpy()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return out


def suite_path(runners: dict, ids: np.ndarray, g: dict) -> dict:
    """The genai suite's decode row as it runs it: every round's tokens, then the replay."""
    out = {}
    for v, r in runners.items():
        gen = r.start_decode(ids, g["steps"])
        rounds = [r.decode(gen, len(ids), g["steps"])[1] for _ in range(g["rounds"] + 1)]
        toks, logits = r.decode_logits(gen, len(ids), g["steps"])
        seq = np.asarray(gen.get_sequence(0), np.int32)
        out[v] = {"rounds": rounds, "replay_tokens": toks, "replay_logits": logits, "sequence": seq}
        del gen
    return out


def teacher_forced(folders: dict, ids: np.ndarray, fed: int, device: str) -> tuple[dict, np.ndarray]:
    drivers = {v: genai_fidelity.GenAIDriver(f, device) for v, f in folders.items()}
    logits, tokens = genai_fidelity.teacher_forced(drivers, [ids], fed)
    return {v: x[:, 0] for v, x in logits.items()}, tokens[:, 0]


def _g(xs) -> list[float]:
    return [float("%.3g" % x) for x in xs]


def nearest_rows(got: np.ndarray, ref: np.ndarray) -> list[tuple[int, float]]:
    """For each row of ``got``, (index of the closest reference row, max |difference| to it)."""
    out = []
    for row in got:
        d = np.abs(ref - row[None]).max(-1)
        out.append((int(d.argmin()), float(d.min())))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the suite's CPU grid (a smoke test)")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fed", type=int, default=16, help="teacher-forced steps after the prompt")
    ap.add_argument("--skip-suite-path", action="store_true")
    ap.add_argument("--cache-dir", default="/tmp/ort_flash_bench")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    g = genai_e2e.grid(args.device, quick=False)
    cache = pathlib.Path(args.cache_dir) / "genai"
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    original = genai_e2e.genai_folder(g, args.device, cache)
    rewritten = original.with_name(original.name + "-ort_flash")
    if not (rewritten / "genai_config.json").is_file():
        genai_e2e.rewrite_folder(original, rewritten)
    folders = {"original": original, "ort_flash": rewritten}
    ids = suite_prompt(g, args.context, args.seed)
    print(f"folders ready in {time.monotonic() - t0:.0f} s; prompt of {len(ids)} ids, first {ids[:6].tolist()}")
    doc: dict = {"context": args.context, "seed": args.seed, "grid": g, "prompt_head": ids[:16].tolist()}

    # 2. teacher-forced through GenAI (fresh generators)
    tf, fed = teacher_forced(folders, ids, args.fed, args.device)
    doc["fed"] = fed.tolist()

    # 1. the suite's own path
    sp = None
    if not args.skip_suite_path:
        runners = {v: genai_e2e.Runner(f) for v, f in folders.items()}
        sp = suite_path(runners, ids, g)
        del runners
        for v in sp:
            doc.setdefault("suite_path", {})[v] = {
                "round_heads": [r[:8] for r in sp[v]["rounds"]],
                "rounds_agree": all(r == sp[v]["rounds"][0] for r in sp[v]["rounds"]),
                "replay_head": sp[v]["replay_tokens"][:8]}
        o, f = sp["original"]["rounds"], sp["ort_flash"]["rounds"]
        doc["suite_path"]["first_difference_per_round"] = [genai_e2e.first_difference(a, b) for a, b in zip(o, f)]
        print("suite path, first difference per round:", doc["suite_path"]["first_difference_per_round"])
        for v in sp:
            print(f"  {v}: rounds agree with each other: {doc['suite_path'][v]['rounds_agree']}; "
                  f"round heads {[r[:4] for r in sp[v]['rounds']]}")

    # 3. the float32 reference
    import gc
    gc.collect()
    ref = Reference(genai_e2e.hf_folder(g, cache), args.device)
    seq = np.concatenate([ids, fed.astype(np.int32)])
    want = ref.logits(seq, args.fed + 1)  # row k: the logits after prompt + k fed tokens
    scale = float(np.abs(want).max())
    doc["teacher_forced"] = {}
    for v, got in tf.items():
        err = np.abs(got - want).max(-1)
        doc["teacher_forced"][v] = {"max_abs_vs_fp32": err.tolist(),
                                    "argmax_equal_fp32": (got.argmax(-1) == want.argmax(-1)).tolist()}
        print(f"teacher-forced {v}: max |logits - fp32| per step {_g(err)} "
              f"(largest logit {scale:.3g})")
    # Where a variant's argmax leaves the reference's: the reference's margin between its token
    # and the variant's (a tie within rounding when below the variant's error there).
    for v, got in tf.items():
        doc["teacher_forced"][v]["argmax_differs"] = [
            {"step": k, "reference_token": int(want[k].argmax()), "token": int(got[k].argmax()),
             "reference_margin": float(want[k].max() - want[k][got[k].argmax()]),
             "max_abs_vs_fp32": float(np.abs(got[k] - want[k]).max())}
            for k in range(len(want)) if got[k].argmax() != want[k].argmax()]
        for x in doc["teacher_forced"][v]["argmax_differs"]:
            print(f"  {v} step {x['step']}: chose {x['token']}, the fp32 reference {x['reference_token']} by "
                  f"{x['reference_margin']:.3g} (this variant's logits {x['max_abs_vs_fp32']:.3g} from the reference)")
    d = np.abs(tf["ort_flash"] - tf["original"]).max(-1)
    doc["teacher_forced"]["ours_vs_original"] = d.tolist()
    print(f"teacher-forced ours vs original: {_g(d)}")

    if sp is not None:
        doc["suite_path_vs_fp32"] = {}
        for v in sp:
            lg = sp[v]["replay_logits"][:8]
            rows = len(sp[v]["sequence"]) - len(ids) + 2  # the logits from the prompt's last two ids on
            want_v = ref.logits(sp[v]["sequence"], rows)
            near = nearest_rows(lg, want_v)
            # a reference row's position: the number of ids it has seen, less the prompt's
            doc["suite_path_vs_fp32"][v] = [{"row": i, "after_prompt_plus": j - 1, "max_abs": e}
                                           for i, (j, e) in enumerate(near)]
            print(f"suite path {v}: replayed rows vs fp32 on its own sequence (the closest reference row "
                  f"as ids after the prompt, max abs): {[(j - 1, _g([e])[0]) for j, e in near]}")
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
