"""End to end through ONNX Runtime GenAI: a LLaMA-shaped model with random weights,
built by GenAI's own model builder, generating with ``og.Generator``, original against rewritten.

1. ``hf_folder``: a Hugging Face folder made with transformers (``LlamaForCausalLM``, seed 0) and
   a ``tokenizers`` WordLevel tokenizer; cached under ``--cache-dir`` by shape.
2. ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp16 -e cuda`` (fp32 / cpu on
   the CPU): every attention layer one com.microsoft.GroupQueryAttention. Cached.
3. ``rewrite_folder``: OUT rewritten as ``ort-flash rewrite OUT -o DST`` writes it (its GQA
   nodes become ort_flash::GroupQueryAttention; ``ort_flash.genai.write_folder``: libort_flash.so
   beside the decoder, named in ``genai_config.json``).
4. Per prompt length P, time to first token: a fresh generator, ``append_tokens`` of P random ids
   (the prefill) and ``generate_next_token`` (choosing the first token), the median of rounds.
   Per context C, decode: a generator with C tokens appended (not timed), then ``steps`` calls
   of ``generate_next_token`` (one decode step each) timed as one span that ends with the last
   token on the host; tokens per second from the median round, ``rewind_to(C)`` between rounds.
   Original and rewritten alternate round by round, so load from elsewhere weighs on both alike.
   Greedy search: the tokens of the two are compared (first token, every decode token); a
   difference marks the row (its ratio stands: both ran the same steps over the same lengths),
   and ``first_flip`` feeds both the original's tokens from the prompt on to say whether the
   first different choice is a tie within rounding (``genai_fidelity`` checks every step).
5. ``--with-fp8``: a third variant, ``ort_flash_fp8``, the folder rewritten with
   ``--attention-precision fp8`` (on sm_90 its first prompts run the FP8 prefill path, decode stays
   in the model's dtype), timed in the same rounds; its rows give ours/original and ours over the
   fp16 rewrite. Its tokens are compared but never mark the row (FP8 is expected to move near ties;
   ``genai_fidelity --with-fp8`` measures by how much).

CUDA grid: 16 layers, hidden 2048, 32/8 heads (head dim 64), vocabulary 32000, fp16; prompts
128 … 16k, contexts 1k … 32k. CPU grid: 2 layers, hidden 256, 8/2 heads, fp32; prompts 64 … 512,
contexts 128 and 512. ``--genai-model LAYERS HIDDEN HEADS KV_HEADS``, ``--seqlens`` (prompts) and
``--caches`` (contexts) override them. Needs onnxruntime-genai (CPU) or onnxruntime-genai-cuda.
"""
from __future__ import annotations

import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from ort_flash.bench import results
from ort_flash.bench.measure import Budget, Context
from ort_flash.bench.op_suite import verdict
from ort_flash.bench.tables import text_table

VARIANTS = ("original", "ort_flash")
FP8_VARIANT = "ort_flash_fp8"  # --with-fp8: the rewrite with --attention-precision fp8
# A timed decode token k is the (k + 2)-th after the prompt (GenAI's first step after a rewind adds
# two tokens); the teacher-forced check feeds that many and one more.
FLIP_SLACK = 3
LIBRARY = "libort_flash.so"
GOALS = {"ttft_2k": 1.3, "ttft_16k": 1.1, "decode": 1.0}  # the goals set for the H200
# The builder's precision and execution provider for each dtype (float32 builds run on the CPU EP).
PRECISIONS = {"float16": ("fp16", "cuda"), "bfloat16": ("bf16", "cuda"), "float32": ("fp32", "cpu")}


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(dtype="float16", layers=16, hidden=2048, heads=32, kv_heads=8, vocab=32000,
                 prompts=[128, 2048, 16384] if quick else [128, 512, 2048, 8192, 16384],
                 contexts=[1024, 32768] if quick else [1024, 4096, 16384, 32768],
                 rounds=3 if quick else 5, steps=32 if quick else 128)
    else:
        g = dict(dtype="float32", layers=2, hidden=256, heads=8, kv_heads=2, vocab=512,
                 prompts=[64, 512] if quick else [64, 128, 256, 512], contexts=[128, 512],
                 rounds=3 if quick else 5, steps=16 if quick else 32)
    if o.get("genai_model"):
        g["layers"], g["hidden"], g["heads"], g["kv_heads"] = o["genai_model"]
    if o.get("layers"):
        g["layers"] = o["layers"]
    if o.get("seqlens"):
        g["prompts"] = o["seqlens"]
    if o.get("caches"):
        g["contexts"] = o["caches"]
    return g


def _name(g: dict, device: str) -> str:
    return f"llama-L{g['layers']}-H{g['hidden']}-{g['heads']}x{g['kv_heads']}-V{g['vocab']}-P{_positions(g)}"


def _positions(g: dict) -> int:
    """max_position_embeddings: a power of two past the longest sequence the grid makes."""
    need = max(max(g["prompts"]), max(g["contexts"])) + 256  # the decode steps' room
    return 1 << (need - 1).bit_length()


def hf_folder(g: dict, cache: pathlib.Path) -> pathlib.Path:
    """A LLaMA-shaped Hugging Face folder with random weights and a WordLevel tokenizer."""
    out = cache / ("hf-" + _name(g, ""))
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    import tokenizers
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=g["vocab"], hidden_size=g["hidden"], intermediate_size=4 * g["hidden"],
        num_hidden_layers=g["layers"], num_attention_heads=g["heads"], num_key_value_heads=g["kv_heads"],
        max_position_embeddings=_positions(g), rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, g["vocab"])}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(tmp)
    tmp.rename(out)
    return out


def genai_folder(g: dict, device: str, cache: pathlib.Path) -> pathlib.Path:
    """GenAI's builder output for the HF folder (cached)."""
    precision, ep = PRECISIONS[g["dtype"]]
    out = cache / f"genai-{_name(g, device)}-{precision}-{ep}"
    if (out / "genai_config.json").is_file():
        return out
    hf = hf_folder(g, cache)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(tmp),
           "-p", precision, "-e", ep, "-c", str(cache / "builder-cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"GenAI's builder failed ({' '.join(cmd[1:])}): "
                           f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    tmp.rename(out)
    return out


def rewrite_folder(src: pathlib.Path, dst: pathlib.Path, gqa_cuda: str | None = None,
                   attention_precision: str = "model") -> dict:
    """dst = src rewritten as ``ort-flash rewrite SRC -o DST`` writes it (ort_flash.genai: the
    decoder rewritten, genai_config.json naming the library copied beside it; ``gqa_cuda`` and
    ``attention_precision`` as ``ort_flash.rewrite`` takes them). Returns the rewrite's counts."""
    import ort_flash
    from ort_flash import genai

    folder = genai.open_folder(src)
    result = ort_flash.rewrite(folder.decoder, gqa_cuda=gqa_cuda, attention_precision=attention_precision)
    genai.write_folder(folder.folder, dst, lambda path: result.save(path), overwrite=True)
    counts = {k: v for k, v in result.report.counts.items() if v}
    return {"counts": counts, "fused": counts.get("group_query_attention", 0)}


def _gqa_nodes(folder: pathlib.Path) -> dict:
    import onnx

    m = onnx.load(folder / "model.onnx", load_external_data=False)
    out: dict = {}
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            out[n.domain] = out.get(n.domain, 0) + 1
    return out


class Runner:
    """One variant's og.Model; the calls the suite times, and the teacher-forced stepping
    (``start_forced``, ``feed``) that ``first_flip`` and ``genai_fidelity.GenAIDriver`` run."""

    def __init__(self, folder: pathlib.Path):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(folder))

    def _generator(self, max_length: int, **options):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length, do_sample=False, **options)
        return self.og.Generator(self.model, params)

    def first_token(self, ids: np.ndarray) -> tuple[float, int]:
        """(seconds from the prompt to the first token, that token)."""
        gen = self._generator(len(ids) + 1)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        return time.perf_counter() - t0, token

    def start_decode(self, ids: np.ndarray, steps: int):
        # Slack: GenAI 0.18's first step after a rewind adds two tokens to the sequence.
        gen = self._generator(len(ids) + steps + 8)
        gen.append_tokens(ids)
        return gen

    def decode(self, gen, context: int, steps: int) -> tuple[float, list[int]]:
        """Seconds per decode step over ``steps`` steps from ``context`` tokens, and the tokens.
        The span ends when the last token is on the host (GenAI's steps may run ahead on CUDA)."""
        _rewind(gen, context)
        t0 = time.perf_counter()
        for _ in range(steps):
            gen.generate_next_token()
        gen.get_next_tokens()
        step_s = (time.perf_counter() - t0) / steps
        return step_s, [int(t) for t in gen.get_sequence(0)[-steps:]]

    def start_forced(self, ids: np.ndarray, steps: int):
        """A fresh generator of one row with the prompt ``ids`` appended, for ``steps`` tokens fed
        after it; and the prompt's logits (float32, vocabulary)."""
        gen = self._generator(len(ids) + steps + 1, batch_size=1)
        gen.append_tokens(ids.reshape(1, -1))
        return gen, self.logits(gen)

    def feed(self, gen, token) -> np.ndarray:
        """One given token (an int, or an array of one) appended (a decode step), and the logits
        after it."""
        gen.append_tokens(np.asarray(token, dtype=np.int32).reshape(1, 1))
        return self.logits(gen)

    @staticmethod
    def logits(gen) -> np.ndarray:
        """The logits of the generator's last step (float32, vocabulary)."""
        return np.asarray(gen.get_logits(), dtype=np.float32).reshape(-1)


def _rewind(gen, context: int) -> None:
    """Back to ``context`` tokens, and the token after them (a model run only after a rewind)."""
    gen.rewind_to(context)
    gen.generate_next_token()
    gen.get_next_tokens()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first step where two token lists differ (None where they agree)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def first_flip(runners: dict, ids: np.ndarray, steps: int) -> dict:
    """Where greedy tokens part, whether the choice was a tie: both variants fed the same tokens
    from the prompt on (the original's greedy choices, one a decode step), the first step where
    ours' argmax leaves the original's. There: the original's margin between its token and ours',
    and the rounding between the two runs (``noise``: the largest |difference| of their logits at
    the steps before and, at that step, over the rest of the vocabulary). A flip whose margin is
    at most twice the noise (the op tests' contract: twice the difference between plain
    implementations) is a tie within rounding; a larger one is an error. ``step`` None: no flip
    within ``steps`` fed tokens."""
    (go, lo), (gf, lf) = (runners[v].start_forced(ids, steps) for v in VARIANTS)
    before = 0.0
    for k in range(steps + 1):
        a, b = int(lo.argmax()), int(lf.argmax())
        if a != b:
            rest = np.delete(np.abs(lo - lf), [a, b])
            noise = max(before, float(rest.max()) if rest.size else 0.0)
            margin = float(lo[a] - lo[b])
            return {"step": k, "original_token": a, "ours_token": b, "original_margin": margin,
                    "noise": noise, "diff_at_tokens": float(max(abs(lo[a] - lf[a]), abs(lo[b] - lf[b]))),
                    "tie": margin <= 2 * noise, "logit_scale": float(np.abs(lo).max())}
        before = max(before, float(np.abs(lo - lf).max()))
        if k < steps:
            lo, lf = runners["original"].feed(go, a), runners["ort_flash"].feed(gf, a)
    return {"step": None, "steps": steps, "noise": before}


def flip_note(d: dict) -> str:
    if d["step"] is None:
        return (f"teacher-forced from the prompt ({d['steps']} tokens fed), the two choose the same token at "
                f"every step (logits at most {d['noise']:.3g} apart)")
    verdict = ("a tie within rounding" if d["tie"] else
               "NOT a tie: the margin is more than twice the rounding between the two runs")
    return (f"teacher-forced from the prompt, ours first chooses another token {d['step']} tokens after it, "
            f"where the original's margin is {d['original_margin']:.3g}, the two runs' logits "
            f"{d['noise']:.3g} apart elsewhere and {d['diff_at_tokens']:.3g} at the two tokens: {verdict}")


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    g = suite["grid"]
    cache = pathlib.Path(getattr(args, "cache_dir", None) or "/tmp/ort_flash_bench") / "genai"
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    original = genai_folder(g, ctx.device, cache)
    rewritten = original.with_name(original.name + "-ort_flash")
    info = {"original": str(original), "rewritten": str(rewritten), "rewrite": rewrite_folder(original, rewritten),
            "adapter": "ort_flash.genai.write_folder"}
    info["gqa_nodes"] = {"original": _gqa_nodes(original), "rewritten": _gqa_nodes(rewritten)}
    info["prepare_s"] = time.monotonic() - t0
    suite["model"] = info
    if not info["rewrite"]["fused"]:
        suite["notes"].append("the rewrite swapped no GroupQueryAttention node: both variants run ONNX Runtime's op")
    save()
    runners = {"original": Runner(original), "ort_flash": Runner(rewritten)}
    if getattr(args, "with_fp8", False):
        fp8 = original.with_name(original.name + "-ort_flash-fp8")
        info["rewrite_fp8"] = rewrite_folder(original, fp8, attention_precision="fp8")
        info["fp8"] = str(fp8)
        runners[FP8_VARIANT] = Runner(fp8)
    info["onnxruntime_genai"] = getattr(runners["original"].og, "__version__", None)
    rng = np.random.default_rng(getattr(args, "seed", 0))
    todo = [("ttft", p) for p in g["prompts"]] + [("decode", c) for c in g["contexts"]]
    for i, (kind, n) in enumerate(progress(todo, desc=f"genai ({ctx.device})", unit="cfg")):
        if not budget.allows():
            suite["not_run"].extend(_config(g, k, m) for k, m in todo[i:])
            suite["notes"].append(f"time budget of {budget.seconds:.0f} s reached")
            break
        ids = rng.integers(3, g["vocab"], n).astype(np.int32)
        cfg = _config(g, kind, n)
        suite["rows"].extend(time_ttft(runners, ids, g, cfg) if kind == "ttft" else time_decode(runners, ids, g, cfg))
        suite["elapsed_s"] = budget.elapsed
        save()


def _config(g: dict, kind: str, n: int) -> dict:
    return {"kind": kind, "tokens": n, "layers": g["layers"], "hidden": g["hidden"], "heads": g["heads"],
            "kv_heads": g["kv_heads"], "dtype": g["dtype"], "batch": 1}


def _rows(cfg: dict, per: dict, tokens: dict, value_key: str) -> list[dict]:
    rows = []
    for v in per:
        if isinstance(per[v], str):
            rows.append({"config": cfg, "peer": v, "status": "error", "reason": per[v]})
            continue
        ms = statistics.median(per[v]) * 1e3
        row = {"config": cfg, "peer": v, "status": "ok", "ms": ms, "samples": len(per[v]),
               "spread": (max(per[v]) - min(per[v])) / statistics.median(per[v]), "tokens": tokens[v]}
        if value_key == "tok_s":
            row["tok_s"] = 1e3 / ms
        rows.append(row)
    by = {r["peer"]: r for r in rows}
    ours, orig = by["ort_flash"], by["original"]
    if ours["status"] == "ok" and orig["status"] == "ok":
        ours["identical"] = ours["tokens"] == orig["tokens"]
        ours["vs_original"] = orig["ms"] / ours["ms"]  # the same steps over the same lengths either way
        if not ours["identical"]:
            first = first_difference(ours["tokens"], orig["tokens"])
            ours.update(status="mismatch", reason=f"tokens differ from the original's (first at step {first})")
    fp8 = by.get(FP8_VARIANT)
    if fp8 and fp8["status"] == "ok" and orig["status"] == "ok":
        fp8["identical"] = fp8["tokens"] == orig["tokens"]
        fp8["vs_original"] = orig["ms"] / fp8["ms"]
        if ours["status"] in ("ok", "mismatch"):
            fp8["vs_rewrite"] = ours["ms"] / fp8["ms"]
    return rows


def time_ttft(runners: dict, ids: np.ndarray, g: dict, cfg: dict) -> list[dict]:
    per = {v: [] for v in runners}
    tokens = {}
    for r in range(g["rounds"] + 1):  # round 0 warms up (session arenas, kernels)
        for v in runners:
            if isinstance(per[v], str):
                continue
            try:
                s, tok = runners[v].first_token(ids)
            except Exception as e:  # noqa: BLE001 - one variant's failure is its row
                per[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                continue
            tokens[v] = [tok]
            if r:
                per[v].append(s)
    return _rows(cfg, per, tokens, "ms")


def time_decode(runners: dict, ids: np.ndarray, g: dict, cfg: dict) -> list[dict]:
    per, tokens, gens = {v: [] for v in runners}, {}, {}
    for v in runners:
        try:
            gens[v] = runners[v].start_decode(ids, g["steps"])
        except Exception as e:  # noqa: BLE001
            per[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    for r in range(g["rounds"] + 1):  # round 0 warms up
        for v in gens:
            if isinstance(per[v], str):
                continue
            try:
                step_s, toks = runners[v].decode(gens[v], len(ids), g["steps"])
            except Exception as e:  # noqa: BLE001
                per[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                continue
            tokens[v] = toks
            if r:
                per[v].append(step_s)
    rows = _rows(cfg, per, tokens, "tok_s")
    ours = rows[1]
    if ours["status"] == "mismatch":
        # Untimed: the two fed the same tokens, to say whether the first different choice is a tie.
        first = first_difference(tokens["original"], tokens["ort_flash"])
        try:
            d = first_flip(runners, ids, first + FLIP_SLACK)
        except Exception as e:  # noqa: BLE001 - the diagnosis is optional
            ours["flip_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        else:
            ours["flip"] = d
            ours["reason"] += ": " + flip_note(d)
    gens.clear()
    return rows


def goal(cfg: dict) -> str | None:
    if cfg["kind"] == "decode":
        return f"≥{GOALS['decode']:g}x"
    if cfg["tokens"] == 2048:
        return f"≥{GOALS['ttft_2k']:g}x"
    if cfg["tokens"] == 16384:
        return f"≥{GOALS['ttft_16k']:g}x"
    return None


def summary(suite: dict, kind: str) -> tuple[list[str], list[list]]:
    what = "ms to first token" if kind == "ttft" else "tok/s"
    fp8 = any(r["peer"] == FP8_VARIANT for r in suite["rows"])
    header = (["prompt" if kind == "ttft" else "context", f"original {what}", f"ort_flash {what}",
               "spread (orig/ours)", "ours/original", "tokens identical", "goal (H200)"]
              + ([f"fp8 {what}", "fp8/original", "fp8/ort_flash", "fp8 tokens identical"] if fp8 else []))
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        if cfg["kind"] != kind:
            continue
        by = {r["peer"]: r for r in group}
        key = "ms" if kind == "ttft" else "tok_s"
        vals = [by[v].get(key) if by[v]["status"] in ("ok", "mismatch") else by[v]["status"] for v in VARIANTS]
        spread = "/".join(f"{100 * by[v]['spread']:.0f}%" if "spread" in by[v] else "–" for v in VARIANTS)
        ours = by["ort_flash"]
        row = [cfg["tokens"], *vals, spread, verdict(ours.get("vs_original")), _identical(ours),
               goal(cfg) if suite["device"] == "cuda" else None]
        if fp8:
            f = by.get(FP8_VARIANT, {"status": "not run"})
            row += [f.get(key) if f["status"] == "ok" else f["status"], verdict(f.get("vs_original")),
                    verdict(f.get("vs_rewrite")), f.get("identical")]
        rows.append(row)
    return header, rows


def _identical(ours: dict):
    """yes / no, and where the tokens differ whether the first different choice was a tie."""
    flip = ours.get("flip")
    if ours.get("identical") is not False or not flip:
        return ours.get("identical")
    if flip["step"] is None:
        return "no (no flip when fed the same tokens)"
    return "no (a tie)" if flip["tie"] else "no (NOT a tie)"


def print_summary(suite: dict) -> None:
    g = suite["grid"]
    m = suite.get("model") or {}
    where = (f"{suite['device']}, {g['dtype']}, LLaMA-shaped random weights: {g['layers']} layers, hidden "
             f"{g['hidden']}, {g['heads']}/{g['kv_heads']} heads, batch 1")
    if m:
        print(f"\nrewrite: {m['rewrite']['counts']}; GroupQueryAttention nodes {m['gqa_nodes']}")
    for kind, what in (("ttft", "time to first token"), ("decode", "decode tokens per second")):
        header, rows = summary(suite, kind)
        if rows:
            print(text_table(header, rows, title=f"\nGenAI end to end on {where}: {what}"))
    print(results.format_reasons(suite["rows"]))
