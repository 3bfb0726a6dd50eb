"""Run an original and a rewritten model on the same random inputs and compare the outputs.

The baseline runs with ONNX Runtime's graph optimizations off (so ORT's own fusions do not blur
the comparison); the rewritten model runs with the ort_flash custom-op library registered
(``ort_flash.session_options()``). Inputs are what a real caller would feed: token ids inside
the vocabulary (read from the embedding Gather the input feeds), 0/1 attention masks padded at
the end of some rows (never a whole row), floats from N(0, 1). Every output element is compared
in float64, padded positions included: the two models must agree everywhere. The inputs and
their sizes are ``ort_flash.feeds``'s (``make_inputs``).

A model whose boolean input is an If condition (an Optimum merged decoder's
``use_cache_branch``) is compared once per value, True then False, so both branches run; with
False, dims of a KV cache's length ("past") are 0, as the uncached branch reads no cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from typing import Any, Sequence

import numpy as np
import onnx

from ort_flash.feeds import (  # noqa: F401 - verify's inputs, imported from here by callers
    DEFAULT_PAST_LEN, DEFAULT_SEQ_LEN, IMAGE_SIZE, InputShapeError, branch_conditions, make_inputs,
    parse_shape,
)
from ort_flash.rewriter.model_io import load_model

# (atol, rtol) by output dtype: pass where |got - want| <= atol + rtol * |want|, elementwise.
TOLERANCES = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (2e-2, 2e-2),
    "bfloat16": (5e-2, 5e-2),
}


class ModelMismatchError(ValueError):
    """The two models do not have the same interface (they cannot be compared)."""


@dataclasses.dataclass
class OutputComparison:
    name: str
    dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float  # largest |got - want| / |want| over elements with |want| >= atol
    atol: float
    rtol: float
    passed: bool


@dataclasses.dataclass
class VerifyResult:
    providers: list[str]  # as requested
    baseline_providers: list[str]  # as the sessions report them
    rewritten_providers: list[str]
    seed: int
    inputs: dict[str, str]  # name -> "dtype[shape]"
    outputs: list[OutputComparison]
    branch: str = ""  # the If conditions fed, e.g. "use_cache_branch=True"; "" without any
    more: list[VerifyResult] = dataclasses.field(default_factory=list)  # the other branches' runs

    @property
    def passed(self) -> bool:
        return (bool(self.outputs) and all(o.passed for o in self.outputs)
                and all(m.passed for m in self.more))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        lines = []
        for run in (self, *self.more):  # one table per If-condition value (branch)
            lines += run._run_table()
        lines.append("  rule: pass where |rewritten - original| <= atol + rtol * |original| at every element;"
                     "\n  max_rel (over |original| >= atol) is shown, not tested. The original runs with"
                     "\n  ONNX Runtime's graph optimizations off (the reference), so even a model checked"
                     "\n  against itself can show a small max_abs.")
        lines.append("PASS" if self.passed else "FAIL: outputs differ beyond tolerance")
        return "\n".join(lines)

    def _run_table(self) -> list[str]:
        feeds = ", ".join(f"{k} {v}" for k, v in self.inputs.items())
        branch = f"; branch {self.branch}" if self.branch else ""
        lines = textwrap.wrap(f"verify on {', '.join(self.rewritten_providers)} (seed {self.seed})"
                              f"{branch}; inputs: {feeds}", 100, subsequent_indent="  ")
        header = ("output", "dtype", "shape", "max_abs", "max_rel", "atol", "rtol", "result")
        rows = [
            (o.name, o.dtype, "x".join(map(str, o.shape)), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}",
             f"{o.atol:g}", f"{o.rtol:g}", "pass" if o.passed else "FAIL")
            for o in self.outputs
        ]
        widths = [max(len(c) for c in col) for col in zip(header, *rows)]
        for row in (header, tuple("-" * w for w in widths), *rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        return lines


def verify(
    original: onnx.ModelProto | str | os.PathLike,
    rewritten: onnx.ModelProto | str | os.PathLike,
    *,
    providers: Sequence[str] | None = None,
    batch: int = 2,
    seq_len: int | None = None,
    past_len: int | None = None,
    seed: int | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    shapes: dict[str, Sequence[int]] | None = None,
    progress=None,
) -> VerifyResult:
    """Compare the two models' outputs on the same random inputs (module docstring); where an
    input is an If condition, once per value (the first run's result holds the others in
    ``more``). ``shapes``: input name -> shape, overriding the default sizes. ``progress``: as
    ``rewrite``'s, called per stage.

    One model is in ONNX Runtime at a time (the original runs every input, its session goes,
    then the rewritten one's is made): the memory is that of one model, not two."""
    import ort_flash
    from ort_flash._onnxruntime import check_providers, import_onnxruntime

    ort = import_onnxruntime()
    providers = list(providers or ["CPUExecutionProvider"])
    check_providers(providers)  # CUDA on the CPU package: refused, not run on the CPU
    if "CUDAExecutionProvider" in providers and hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()  # how onnxruntime-gpu finds the nvidia-* wheels' CUDA libraries
        except Exception:  # noqa: BLE001 - absent CUDA wheels: the session reports it
            pass
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**31))
    original_proto = load_model(original)
    conditions = branch_conditions(original_proto)
    past_len = DEFAULT_PAST_LEN if past_len is None else past_len

    tell = progress or (lambda stage, done=None, total=None: None)
    values = (True, False) if conditions else (None,)
    all_feeds = []
    for value in values:
        feeds = make_inputs(original_proto, batch=batch, seq_len=seq_len or DEFAULT_SEQ_LEN,
                            past_len=past_len if value is not False else 0, seed=seed,
                            shapes=shapes)
        for name, shape in conditions.items():
            feeds[name] = np.full(shape, value, dtype=bool)
        all_feeds.append(feeds)
    del original_proto
    ort_flash.check_op_version(_source(rewritten))

    tell("running the original")
    base_opts = ort.SessionOptions()
    base_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    _one_run(base_opts)
    base = ort.InferenceSession(_source(original), base_opts, providers=providers)
    names = [o.name for o in base.get_outputs()]
    base_providers = base.get_providers()
    # Copies: an output array can keep the session's memory arena alive after the session goes.
    wants = [{n: np.array(x, copy=True) for n, x in zip(names, base.run(names, feeds))} for feeds in all_feeds]
    del base

    tell("running the rewritten model")
    fast = ort.InferenceSession(_source(rewritten), _one_run(ort_flash.session_options()),
                                providers=providers)
    missing = sorted(set(names) - {o.name for o in fast.get_outputs()})
    if missing:
        raise ModelMismatchError(f"the rewritten model lacks outputs {missing}")
    runs = []
    for value, feeds, want in zip(values, all_feeds, wants):
        extra = sorted({i.name for i in fast.get_inputs()} - set(feeds))
        if extra:
            raise ModelMismatchError(f"the rewritten model needs inputs the original lacks: {extra}")
        got = dict(zip(names, fast.run(names, feeds)))
        tell("comparing")
        runs.append(VerifyResult(
            providers=providers, baseline_providers=base_providers,
            rewritten_providers=fast.get_providers(), seed=seed,
            inputs={k: f"{_dtype_name(v.dtype)}[{','.join(map(str, v.shape))}]"
                    for k, v in feeds.items()},
            outputs=[_compare(n, got[n], want[n], atol, rtol) for n in names],
            branch=", ".join(f"{n}={value}" for n in conditions)))
    runs[0].more = runs[1:]
    return runs[0]


def _one_run(options):
    """Session options for a model run once or twice: weights are not prepacked (a copy of every
    MatMul weight, which saves nothing over one run; without it ONNX Runtime maps external data
    and the session costs the model's size once)."""
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def _compare(name, got, want, atol, rtol) -> OutputComparison:
    dtype = _dtype_name(want.dtype)
    default = TOLERANCES.get(dtype, (0.0, 0.0))  # non-float outputs must match exactly
    atol = default[0] if atol is None else atol
    rtol = default[1] if rtol is None else rtol
    if got.shape != want.shape:
        return OutputComparison(name, dtype, list(want.shape), float("inf"), float("inf"),
                                atol, rtol, False)
    a, b = got.astype(np.float64), want.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))  # equal infinities and NaN in both agree
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
    big = np.abs(b) >= max(atol, np.finfo(np.float64).tiny)
    max_abs = float(diff.max(initial=0.0))
    max_rel = float((diff[big] / np.abs(b[big])).max(initial=0.0))
    passed = bool(np.all(diff <= atol + rtol * np.abs(np.nan_to_num(b))))
    return OutputComparison(name, dtype, list(want.shape), max_abs, max_rel, atol, rtol, passed)


def _dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype.name == "bfloat16" else np.dtype(dtype).name


def _source(model: onnx.ModelProto | str | os.PathLike):
    """What InferenceSession takes: a path as it is (external data stays next to it), else bytes."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    return os.fspath(model)
