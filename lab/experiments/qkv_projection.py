"""How a self-attention's Q/K/V projection (with biases) is cheapest in ONNX Runtime's CUDA EP.

BERT's packed QKV (packed_qkv) is one MatMul of [Wq | Wk | Wv] and one bias Add over its
(B, S, 3 H) output. On the H200 that Add ran at 2.7 TB/s (ORT's
``_BinaryElementWiseRhsPerChannelBatchN``), 167 us over 12 layers at 4096 tokens, against 120 us for
the bias-and-transpose of ONNX Runtime's own Attention (docs/perf-notes.md, prefill v11). This
times, kernel by kernel through CUPTI (torch.profiler), the ways of writing the same projection
with ONNX ops, 12 copies per graph (as 12 layers), fp16:

    packed        MatMul(x, Wqkv) + Add(bqkv)                         (what packed_qkv writes)
    packed_gemm   Reshape to 2-D, Gemm(x, Wqkv, bqkv), Reshape back   (cuBLAS with beta = 1)
    q_bias_kv     MatMul(x, Wq) + Add(bq), MatMul(x, Wkv)             (K bias dropped, V bias folded)
    packed_nobias MatMul(x, Wqkv)                                     (the floor: no bias at all)

The K bias can be dropped exactly (q . bk is the same for every key of a query, and softmax does
not see a constant), the V bias moved after the attention (its weights sum to one); this measures
whether that is worth an op form with K and V packed apart from Q.

    python lab/experiments/qkv_projection.py [--tokens 4096 2048] [--out qkv.json]

Needs onnxruntime-gpu and torch (CUPTI); not ort_flash.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import statistics
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LAYERS = 12


def build(variant: str, hidden: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, outputs = [], [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    x = "x"
    if variant == "packed_gemm":
        nodes.append(helper.make_node("Reshape", [x, const("flat", np.array([-1, hidden], np.int64))], ["x2"]))
        nodes.append(helper.make_node("Shape", [x], ["bs"], start=0, end=2))
    for i in range(LAYERS):
        w = (rng.standard_normal((hidden, 3 * hidden)) / np.sqrt(hidden)).astype(np.float16)
        b = rng.standard_normal(3 * hidden).astype(np.float16)
        y = f"y{i}"
        if variant == "packed":
            nodes.append(helper.make_node("MatMul", [x, const(f"w{i}", w)], [f"m{i}"]))
            nodes.append(helper.make_node("Add", [f"m{i}", const(f"b{i}", b)], [y]))
            outputs.append((y, 3 * hidden))
        elif variant == "packed_nobias":
            nodes.append(helper.make_node("MatMul", [x, const(f"w{i}", w)], [y]))
            outputs.append((y, 3 * hidden))
        elif variant == "packed_gemm":
            nodes.append(helper.make_node("Gemm", ["x2", const(f"w{i}", w), const(f"b{i}", b)], [f"g{i}"]))
            shape = f"s{i}"
            nodes.append(helper.make_node("Concat", ["bs", const(f"n{i}", np.array([3 * hidden], np.int64))],
                                          [shape], axis=0))
            nodes.append(helper.make_node("Reshape", [f"g{i}", shape], [y]))
            outputs.append((y, 3 * hidden))
        elif variant == "q_bias_kv":
            nodes.append(helper.make_node("MatMul", [x, const(f"wq{i}", w[:, :hidden].copy())], [f"mq{i}"]))
            nodes.append(helper.make_node("Add", [f"mq{i}", const(f"bq{i}", b[:hidden].copy())], [y]))
            nodes.append(helper.make_node("MatMul", [x, const(f"wkv{i}", w[:, hidden:].copy())], [f"kv{i}"]))
            outputs.append((y, hidden))
            outputs.append((f"kv{i}", 2 * hidden))
        else:
            raise ValueError(variant)
    graph = helper.make_graph(
        nodes, variant, [helper.make_tensor_value_info(x, TensorProto.FLOAT16, ["B", "S", hidden])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["B", "S", c]) for n, c in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def kernels(run, runs: int) -> dict[str, float]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        trace = json.loads(pathlib.Path(path).read_text())
    finally:
        os.unlink(path)
    per = collections.Counter()
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel":
            per[e["name"]] += e["dur"] / runs
    return dict(per)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 2048])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--variants", nargs="+", default=["packed", "packed_gemm", "q_bias_kv", "packed_nobias"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()

    import onnxruntime as ort

    ort.preload_dlls()
    rows = []
    sessions = {}
    for v in args.variants:
        so = ort.SessionOptions()
        sessions[v] = ort.InferenceSession(build(v, args.hidden).SerializeToString(), so,
                                           providers=["CUDAExecutionProvider"])
    for tokens in args.tokens:
        rng = np.random.default_rng(tokens)
        runs = {}
        for v, sess in sessions.items():
            io = sess.io_binding()
            x = rng.standard_normal((1, tokens, args.hidden)).astype(np.float16)
            io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
            for o in sess.get_outputs():
                io.bind_output(o.name, "cuda")

            def run(sess=sess, io=io):
                io.synchronize_inputs()
                sess.run_with_iobinding(io)
                io.synchronize_outputs()
            runs[v] = run
        for run in runs.values():
            for _ in range(5):
                run()
        walls = {v: [] for v in runs}
        names = list(runs)
        for r in range(args.rounds):
            for k in range(len(names)):
                v = names[(r + k) % len(names)]
                t0 = time.perf_counter()
                runs[v]()
                walls[v].append((time.perf_counter() - t0) * 1e3)
        print(f"\ntokens {tokens}, hidden {args.hidden}, {LAYERS} projections")
        for v, run in runs.items():
            per = kernels(run, 10)
            total = sum(per.values())
            rows.append({"variant": v, "tokens": tokens, "hidden": args.hidden, "layers": LAYERS,
                         "kernel_us": total, "wall_ms": statistics.median(walls[v]),
                         "kernels_us": dict(sorted(per.items(), key=lambda kv: -kv[1]))})
            print(f"  {v:14s} kernels {total:8.1f} us, wall {statistics.median(walls[v]):.3f} ms")
            for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:4]:
                print(f"      {us:8.1f} us  {name[:100]}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "onnxruntime": ort.__version__}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
