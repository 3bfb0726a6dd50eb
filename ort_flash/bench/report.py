"""Result JSON files → docs/PERFORMANCE.md (tables, goals) and PNG plots beside it.

    python -m ort_flash.bench.report results-gpu.json results-cpu.json -o docs/PERFORMANCE.md

Later files override earlier ones suite by suite, so a new GPU run replaces only what it
measured. GPU sections without a CUDA result say "not yet measured".
"""
from __future__ import annotations

import argparse
import os
import pathlib

from ort_flash.bench import (cpu_suite, decode_e2e_suite, decode_suite, e2e_suite, genai_e2e, genai_fidelity,
                              gqa_suite, op_suite, plots, results, targets)
from ort_flash.bench.tables import fmt, markdown_table

REPRODUCE_RUNS = """\
# A machine with an NVIDIA GPU (sm_80 or sm_90) and the package installed with the benchmark's
# peers: pip install ".[test]" (torch with CUDA for SDPA and the exports, transformers).
# Each suite writes its JSON as it goes; the times are the H200's and the 2-core CPU's.
ort-flash bench --device cuda --suite op --out bench-op.json                  # the op grid, ~5 min (--quick ~1)
ort-flash bench --device cuda --suite decode --out bench-decode.json          # the decode grid, ~2 min
ort-flash bench --device cuda --suite e2e --out bench-e2e.json                # whole models (exports cached)
ort-flash bench --device cuda --suite decode_e2e --out bench-decode_e2e.json  # a decode step of a whole model
ort-flash bench --device cpu --suite cpu --out bench-cpu.json                 # the CPU EP, ~15 min on 2 cores
# LLMs (GroupQueryAttention; the genai suites need onnxruntime-genai-cuda):
ort-flash bench --device cuda --suite gqa --out bench-gqa.json                # GenAI's attention op, ~2 min
ort-flash bench --device cuda --suite gqa --qk-norm --out bench-gqa-qk.json   # with Qwen3's Q/K norms
ort-flash bench --device cuda --suite gqa --sinks --out bench-gqa-sinks.json  # with gpt-oss's attention sinks
ort-flash bench --device cuda --suite gqa --window 4096 --out bench-gqa-w.json  # a window-sized KV cache
ort-flash bench --device cuda --suite genai --out bench-genai.json            # a GenAI folder end to end
ort-flash bench --device cuda --suite genai_fidelity --out bench-fid.json     # teacher-forced logits"""
REPRODUCE_PAGE = """\
# this page, from those files (later files override earlier ones suite by suite):
python -m ort_flash.bench.report bench-cpu.json bench-op.json bench-decode.json bench-e2e.json \\
    bench-decode_e2e.json bench-gqa.json bench-gqa-qk.json bench-genai.json bench-fid.json -o PERFORMANCE.md
# lab/gpu/README.md: the GPU release check, on any CUDA machine with onnxruntime-gpu."""
METHOD = """\
- **Same run, same machine.** Every peer is timed beside the fused op in one process per suite;
  ratios compare numbers from the same run only.
- **Inputs**: fresh N(0, 1) values (never zeros), several sets rotated so that each call reads
  memory, not cache (at least 256 MiB touched; up to 8 sets); outputs preallocated and poisoned.
- **ONNX Runtime peers** run one-node models bound with IOBinding to device-resident buffers,
  on the timer's CUDA stream (`user_compute_stream`), without per-run synchronization; a peer
  ONNX Runtime cannot place on the CUDA EP is reported *n/a* with ORT's reason, never timed on the
  CPU. The unfused graph runs with ORT graph optimizations off (so ORT does not fuse it).
- **Timing**: CUDA events around chunks of back-to-back calls (≥ 1 ms each), median over
  chunks; decode shapes replay CUDA graphs (ORT `enable_cuda_graph`, `torch.cuda.graph`) so launch
  overhead does not hide the kernels, and so does the op suite from 2026-12-05 on (its ONNX
  Runtime peers as a model of up to 32 copies of their node, about 1 ms a run, as below; each
  row's `timing` in the JSON says which). Earlier op runs timed one node per session run, ONNX
  Runtime's launch cost included: at BERT-sized shapes (15-50 µs kernels) that cost is most of
  every ORT peer's time. CPU: host clock, median.
- **Correctness**: each peer's output is compared with the float64 reference
  (`ort_flash.reference`) on sampled rows; a peer over the limit is marked WRONG.
- **Rates**: TFLOP/s = 4·B·H·Sq·Skv·D / t, halved when causal; KV bandwidth = bytes of K and V /
  t; *of ceiling* divides by the 8192³ matmul rate in the row's dtype or the device-to-device
  copy bandwidth (bytes read + written), both measured at the start of the same run.
- **Decode timing classes**: every peer is timed as device time in a CUDA graph of ≥ 32 calls:
  torch SDPA and the kernel alone replay one torch CUDA graph holding ≥ 32 calls; `ort_flash`,
  `ort_gqa` and `ort_mha` run a model of up to 32 copies of their node (as a model's layers run
  in one step; ORT's CUDA graph replayed once per `Run`, node j of run i reading input set
  (i + j) mod sets; each row's JSON records its `layers`) and a row is a run's time over the
  copies. `ort_flash_run` is the op one node per
  `Run`: ONNX Runtime's per-run cost (~1-2.5 µs at B1) included, as a one-node model pays it;
  `ort_flash_past` too (its present copies would not fit 32 times).
- **"peer wins"** marks every shape where a competitor is faster than ours."""


def pick_suites(docs: list[dict]) -> dict[tuple[str, str], tuple[dict, dict]]:
    """{(suite, device): (suite, its document)}; later documents win."""
    out = {}
    for doc in docs:
        for name, suite in doc["suites"].items():
            out[(name, suite["device"])] = (suite, doc)
    return out


LLM_SUITES = ("gqa", "genai", "genai_fidelity")


def llm_variant(name: str, suite: dict) -> str:
    """What tells one LLM suite run from another of the same suite (each gets a section of its
    own, a later run of the same variant replacing an earlier one): the gqa suite's dtype and
    options, the genai suite's model."""
    g = suite.get("grid", {})
    if name == "gqa":
        return ", ".join([g.get("dtype", "?"), *gqa_suite.options(g)])
    if name == "genai":
        return (f"{g.get('layers')} layers, hidden {g.get('hidden')}, {g.get('heads')}/{g.get('kv_heads')} heads "
                f"of {g['hidden'] // g['heads'] if g.get('hidden') and g.get('heads') else '?'}, {g.get('dtype')}")
    return ""


def pick_llm(docs: list[dict]) -> list[tuple[str, str, dict, dict]]:
    """[(suite name, variant, suite, its document)] of the LLM suites, in first-seen order; later
    documents win per (suite, device and variant)."""
    out: dict[tuple[str, str], tuple[dict, dict]] = {}
    for doc in docs:
        for name, suite in doc["suites"].items():
            if name in LLM_SUITES:
                device = "CUDA" if suite["device"] == "cuda" else "CPU EP"
                variant = llm_variant(name, suite)
                out[(name, device + (f", {variant}" if variant else ""))] = (suite, doc)
    return [(name, variant, suite, doc) for (name, variant), (suite, doc) in out.items()]


def environment_rows(docs_used: list[dict]) -> tuple[list[str], list[list]]:
    header = ["run", "device", "GPU / CPU", "driver", "onnxruntime", "torch", "triton (AOT)", "date", "commit",
              "matmul ceiling", "copy ceiling", "load avg (start → end)"]
    rows = []
    for doc in docs_used:
        env, ceil = doc["environment"], doc.get("ceilings", {})
        gpu = env.get("gpu") or {}
        v = env.get("versions", {})
        commit = (env.get("git") or {}).get("commit")
        dirty = (env.get("git") or {}).get("dirty")
        rows.append([", ".join(doc["suites"]), env["device"],
                     gpu.get("name") or f"{env['host']['cpu']} ({env['host']['cores']} cores)",
                     gpu.get("driver_version"), v.get("onnxruntime"), v.get("torch"),
                     f"{v.get('triton')} ({v.get('aot_triton')})", env["date"],
                     ((commit[:10] + (" +local changes" if dirty else "")) if commit else "?") +
                     (f", lib {v['library']['sha256'][:8]}" if v.get("library") else ""),
                     f"{fmt(ceil.get('matmul_tflops'))} TFLOP/s", f"{fmt(ceil.get('copy_tbps'))} TB/s",
                     _load(env, doc)])
    return header, rows


def _load(env: dict, doc: dict) -> str | None:
    """1-minute load average at the start and at the end of each suite: above the core count,
    other work shared the machine and the timings are noisy."""
    start = (env.get("host") or {}).get("loadavg_at_start")
    ends = [s.get("loadavg_at_end") for s in doc["suites"].values() if s.get("loadavg_at_end")]
    if not start:
        return None
    return f"{start[0]:.1f} → " + ", ".join(f"{e[0]:.1f}" for e in ends) if ends else f"{start[0]:.1f}"


def _reasons(rows) -> str:
    text = results.format_reasons(rows)
    return "" if not text else "\n```\n" + text + "\n```\n"


def _section(title: str, found, body) -> list[str]:
    lines = [f"## {title}", ""]
    if found is None:
        return lines + ["Not yet measured.", ""]
    suite, doc = found
    lines.append(f"From the run of {doc['environment']['date']} ({suite['status']}, "
                 f"{suite['elapsed_s']:.0f} s{'; ' + '; '.join(suite['notes']) if suite['notes'] else ''}).")
    lines.append("")
    return lines + body(suite)


def render(docs: list[dict], out_md: str | os.PathLike) -> str:
    out_md = pathlib.Path(out_md)
    img_dir = out_md.parent / "performance"
    chosen = pick_suites(docs)
    gpu = {name: chosen.get((name, "cuda")) for name in ("op", "decode", "e2e", "decode_e2e")}
    cpu = chosen.get(("cpu", "cpu"))
    suites_for_plots = {k: v[0] for k, v in gpu.items() if v} | ({"cpu": cpu[0]} if cpu else {})
    pngs = plots.draw_all(suites_for_plots, img_dir)

    def img(key, alt):
        p = pngs.get(key)
        return [f"![{alt}](performance/{p.name})", ""] if p else []

    llm = pick_llm(docs)
    used = []
    for found in [*gpu.values(), cpu, *((suite, doc) for _, _, suite, doc in llm)]:
        if found and found[1] not in used:
            used.append(found[1])
    lines = ["<!-- generated by `python -m ort_flash.bench.report`; edit the generator, not this file -->",
             "# Performance", "",
             "What `ort-flash bench` measured: the fused `ort_flash::FlashAttention` against ONNX Runtime's "
             "own attention, the unfused graph and torch SDPA, and for LLMs the `GroupQueryAttention` drop-in and "
             "rewritten GenAI folders against ONNX Runtime's own, in the same run on the same machine.", "",
             "## Runs", "", markdown_table(*environment_rows(used)) if used else "No results yet.", "",
             "## Goals", "", markdown_table(["goal", "status", "detail"],
                                            [list(g) for g in targets.all_goals({k: v[0] for k, v in gpu.items() if v}
                                                                                | ({"cpu": cpu[0]} if cpu else {}))]),
             ""]

    def op_body(suite):
        out = ["TFLOP/s per peer; *ours/best* is the fused op in ORT over the best competitor, "
               "*kernel/best* the kernel alone.", ""]
        for dtype in dict.fromkeys(r["config"]["dtype"] for r in suite["rows"]):
            part = dict(suite, rows=[r for r in suite["rows"] if r["config"]["dtype"] == dtype])
            out += [f"### {dtype}", "", markdown_table(*op_suite.summary(part)), ""] + img(f"op_{dtype}", f"TFLOP/s {dtype}")
        return out + [_reasons(suite["rows"])]

    def decode_body(suite):
        return ["Effective KV read bandwidth (TB/s) per peer.", "", markdown_table(*decode_suite.summary(suite)), "",
                *img("decode", "decode bandwidth"), _reasons(suite["rows"])]

    def e2e_body(suite):
        models = suite.get("models", {})
        notes = [f"- **{k}**: {v['spec']['parameters'] / 1e6:.0f} M parameters at {v['spec']['layers']} layers; "
                 f"{line.split(': ', 1)[1]}" for (k, v), line in zip(models.items(), e2e_suite.model_notes(suite))]
        method = suite["rows"][0].get("memory_method") if suite["rows"] else None
        combined = any(r["peer"] == "ort_flash_opt" for r in suite["rows"])
        what = (" *ort_flash_opt* is ort_flash with the ORT optimizer's other fusions: the optimizer with its "
                "attention fusion off (LayerNorm, SkipLayerNorm, Gelu, ... stay), the same fp16 conversion, then "
                "`ort_flash.rewrite` (`ort_flash.ort_fusions`), verified against the original before timing."
                if combined else "")
        return ["Median latency and peak memory per variant (batch 1). Memory: " + (method or "–") +
                ", minus the reading before the session existed (see `e2e_suite.py`)." + what, "",
                markdown_table(*e2e_suite.summary(suite)), "", *notes, "",
                *img("e2e_latency", "e2e latency"), *img("e2e_memory", "e2e memory"), _reasons(suite["rows"])]

    def decode_e2e_body(suite):
        return ["One decoding step of the LLaMA-style model (`llama-1b`, GQA 32/8 heads, head dim 64): one new "
                "token per sequence against a KV cache of `past` tokens in every layer, the ONNX past/present "
                "interface (each step also writes past ++ new into `present`). Median wall time of a "
                "`run_with_iobinding` plus the device synchronization (ONNX Runtime's host work included, no "
                "CUDA graphs), every input, past and present bound to device buffers allocated beforehand. "
                "*vs* columns: the other variant's time over the rewritten model's (> 1: rewritten faster). MB: "
                "what ONNX Runtime holds (weights, arena) beyond the bound buffers (see `decode_e2e_suite.py`).", "",
                markdown_table(*decode_e2e_suite.summary(suite)), "",
                *[f"- **{line.split(':', 1)[0]}**:{line.split(':', 1)[1]}" for line in decode_e2e_suite.model_notes(suite)],
                "", *img("decode_e2e", "decode step latency"), _reasons(suite["rows"])]

    def cpu_body(suite):
        host = cpu[1]["environment"]["host"]
        load = host.get("loadavg_at_start") or [0]
        warn = []
        if load[0] > (host.get("cores") or 1):
            warn = [f"**Noisy machine**: the load average was {load[0]:.1f} on {host.get('cores')} cores when "
                    "this ran (other work shared it). Peers are timed round-robin in one process, so ratios "
                    "suffer less than absolute times; memory readings are unaffected. Rerun on a quiet "
                    "machine before quoting a time.", ""]
        return [*warn, "Median latency (peers timed round-robin in one process; *ours spread* is the "
                "interquartile range of the fused op's samples over their median) and the extra peak RSS "
                "one call needs (a fresh process per peer).", "",
                markdown_table(*cpu_suite.summary(suite)), "", *img("cpu", "CPU latency and memory"),
                _reasons(suite["rows"])]

    lines += _section("Op level (CUDA)", gpu["op"], op_body)
    lines += _section("Decode (CUDA)", gpu["decode"], decode_body)
    lines += _section("End to end (CUDA, fp16)", gpu["e2e"], e2e_body)
    lines += _section("Decode step, end to end (CUDA, fp16)", gpu["decode_e2e"], decode_e2e_body)
    lines += _section("CPU EP (fp32)", cpu, cpu_body)
    lines += llm_sections(llm)
    lines += ["## How it is measured", "", METHOD, "", "## How to reproduce", "", "```sh", REPRODUCE_RUNS,
              REPRODUCE_PAGE, "```", ""]
    text = "\n".join(lines).replace("\n\n\n", "\n\n")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text)
    return text


def llm_sections(llm: list[tuple[str, str, dict, dict]]) -> list[str]:
    """The GroupQueryAttention op, GenAI end to end and the teacher-forced fidelity check."""
    titles = {"gqa": "GroupQueryAttention, GenAI's attention op", "genai": "GenAI end to end",
              "genai_fidelity": "GenAI fidelity, teacher-forced"}
    intro = {
        "gqa": "`ort_flash::GroupQueryAttention` (`ort_flash`) against ONNX Runtime's `GroupQueryAttention` "
               "(`ort_gqa`) on GenAI's inputs (packed QKV, rotary, one max-length KV buffer bound as past and "
               "present), ort_flash's plain `FlashAttention` op on the same attention (`ort_flash_fa`, first "
               "prompts) and torch SDPA (cuDNN); first prompts of 16k tokens in all (B × N), decode steps over "
               "a cache. *guard*: ours against ONNX Runtime's output and the cache rows written.",
        "genai": "A LLaMA-shaped model with random weights built by GenAI's model builder, the original folder "
                 "against the rewritten one through `onnxruntime_genai` (greedy). Where decode tokens differ, "
                 "the row's reason says whether the first different choice is a tie within rounding "
                 "(both fed the original's tokens from the prompt on).",
        "genai_fidelity": "Both folders fed the same tokens (the prompt, then the original's greedy choices); per "
                          "step the largest logit difference against a bound of twice ONNX Runtime's own "
                          "decode-versus-prefill difference. A differing argmax within the bound is a tie.",
    }
    lines: list[str] = []
    for name, variant, suite, doc in llm:
        title = f"{titles[name]} ({variant})"

        def body(suite, name=name):
            out = [intro[name], ""]
            if name == "gqa":
                for phase in ("prefill", "decode"):
                    header, rows = gqa_suite.summary(suite, phase)
                    if rows:
                        out += [f"### {'First prompt' if phase == 'prefill' else 'Decode'}", "",
                                markdown_table(header, rows), ""]
            elif name == "genai":
                for kind, what in (("ttft", "Time to first token"), ("decode", "Decode")):
                    header, rows = genai_e2e.summary(suite, kind)
                    if rows:
                        out += [f"### {what}", "", markdown_table(header, rows), ""]
            else:
                out += [markdown_table(*genai_fidelity.summary(suite)), ""]
            return out + [_reasons(suite["rows"])]
        lines += _section(title, (suite, doc), body)
    return lines


def write_report(paths, out_md) -> str:
    return render([results.load(p) for p in paths if p and pathlib.Path(p).is_file()], out_md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="result JSON files, oldest first")
    ap.add_argument("-o", "--out", default="docs/PERFORMANCE.md")
    args = ap.parse_args(argv)
    write_report(args.results, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
