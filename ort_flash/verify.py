"""Run an original and a rewritten model on the same random inputs and compare the outputs.

The baseline runs with ONNX Runtime's graph optimizations off (so ORT's own fusions do not blur
the comparison); the rewritten model runs with the ort_flash custom-op library registered
(``ort_flash.session_options()``). Inputs are what a real caller would feed: token ids inside
the vocabulary (read from the embedding Gather the input feeds), 0/1 attention masks padded at
the end of some rows (never a whole row), floats from N(0, 1). Every output element is compared
in float64, padded positions included: the two models must agree everywhere. The inputs and
their sizes are ``ort_flash.feeds``'s (``make_inputs``).

A rewritten model with FP8 attention (nodes stamped ``attention_precision="fp8"``, ``rewrite``'s
option) also runs as a copy with that attribute removed (the model's-dtype path), and the
original converted to float32 (``float32_reference``) runs on the CPU EP as the float32
reference: each output is reported for both runs against the original and against that
reference, so that the error FP8 adds shows beside the dtype's own. Such a model passes where
the dtype path passes the usual rule against the original and the FP8 run's error against the
float32 reference is within the FP8 allowance (``FP8_RULE``).

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
from ort_flash.rewriter.model_io import first_line, load_model
from ort_flash.rewriter.subgraphs import subgraphs

# (atol, rtol) by output dtype: pass where |got - want| <= atol + rtol * |want|, elementwise.
TOLERANCES = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (2e-2, 2e-2),
    "bfloat16": (5e-2, 5e-2),
}


# The FP8 allowance: the FP8 run may differ from the float32 reference by this factor times the
# model-dtype run's largest difference from it, or by the dtype tolerance, whichever is larger.
# An e4m3 operand keeps 3 mantissa bits to float16's 10, but its rounding reaches the outputs
# through attention alone, averaged over the keys, while the dtype run's difference holds the
# rounding of every layer: a few times that bounds it, and the dtype tolerance floors it.
FP8_FACTOR = 4.0
FP8_RULE = ("FP8 rule (the result of each output of a model with FP8 attention): pass where the "
            "model-dtype run passes the rule above against the original and, at every element, "
            f"|fp8 - float32 reference| <= max({FP8_FACTOR:g} x the model-dtype run's max_abs against the "
            "float32 reference, atol + rtol * |float32 reference|)")


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
class Fp8Comparison:
    """One output of a model with FP8 attention: the FP8 run (the model as given) and the
    model's-dtype run (attention_precision removed), each against the original and against the
    float32 reference (largest absolute differences)."""
    name: str
    fp8_abs: float  # |fp8 - original|
    dtype_abs: float  # |model dtype - original|
    fp8_ref_abs: float  # |fp8 - float32 reference|
    dtype_ref_abs: float  # |model dtype - float32 reference|
    original_ref_abs: float  # |original - float32 reference|: the original's own rounding
    allowance: float  # FP8_FACTOR x dtype_ref_abs (FP8_RULE)
    dtype_passed: bool  # the model-dtype run against the original, by the usual rule
    fp8_passed: bool  # the FP8 run against the float32 reference, by FP8_RULE

    @property
    def passed(self) -> bool:
        return self.dtype_passed and self.fp8_passed


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
    # With FP8 attention: how many nodes have it, what the float32 reference is, and per output
    # both runs' errors (``outputs`` is then the FP8 run against the original, its result FP8_RULE's).
    fp8_nodes: int = 0
    reference: str = ""
    fp8: list[Fp8Comparison] = dataclasses.field(default_factory=list)

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
        if self.fp8_nodes:
            lines += textwrap.wrap(FP8_RULE, 100, initial_indent="  ", subsequent_indent="  ")
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
        lines += _columns(header, rows)
        return lines + (self._fp8_table() if self.fp8_nodes else [])

    def _fp8_table(self) -> list[str]:
        lines = textwrap.wrap(f"FP8 attention in {self.fp8_nodes} node(s): the FP8 run (the model as "
                              "given) and the model-dtype run (attention_precision removed), against the original and "
                              f"against the float32 reference ({self.reference})", 100,
                              initial_indent="  ", subsequent_indent="  ")
        header = ("output", "run", "max_abs vs original", "max_abs vs float32", "allowance", "result")
        rows = []
        for c in self.fp8:
            rows += [(c.name, "fp8", f"{c.fp8_abs:.3g}", f"{c.fp8_ref_abs:.3g}", f"{c.allowance:.3g}",
                      "pass" if c.fp8_passed else "FAIL"),
                     ("", "model dtype", f"{c.dtype_abs:.3g}", f"{c.dtype_ref_abs:.3g}", "",
                      "pass" if c.dtype_passed else "FAIL"),
                     ("", "original", "", f"{c.original_ref_abs:.3g}", "", "")]
        return lines + _columns(header, rows)


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
            for row in (header, tuple("-" * w for w in widths), *rows)]


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
    then the rewritten one's is made; with FP8 attention the float32 reference, the rewritten
    model and its model-dtype copy follow in turn): the memory is that of one model, not two."""
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
    wants = _outputs(base, names, all_feeds, rewritten=False)
    del base

    fp8_nodes = _fp8_nodes(rewritten)
    if fp8_nodes:
        tell("running the float32 reference")
        refs, reference = _float32_reference(ort, original, names, all_feeds, wants)

    tell("running the rewritten model")
    fast = ort.InferenceSession(_source(rewritten), _one_run(ort_flash.session_options()),
                                providers=providers)
    gots = _outputs(fast, names, all_feeds)
    fast_providers = fast.get_providers()
    del fast
    if fp8_nodes:
        tell("running the rewritten model in its dtype")
        source, folder = _without_fp8(rewritten)
        options = _one_run(ort_flash.session_options())
        if folder is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        in_dtype = _outputs(ort.InferenceSession(source, options, providers=providers), names, all_feeds)
        del source

    tell("comparing")
    runs = []
    for i, (value, feeds, want, got) in enumerate(zip(values, all_feeds, wants, gots)):
        run = VerifyResult(
            providers=providers, baseline_providers=base_providers,
            rewritten_providers=fast_providers, seed=seed,
            inputs={k: f"{_dtype_name(v.dtype)}[{','.join(map(str, v.shape))}]"
                    for k, v in feeds.items()},
            outputs=[_compare(n, got[n], want[n], atol, rtol) for n in names],
            branch=", ".join(f"{n}={value}" for n in conditions))
        if fp8_nodes:
            run.fp8_nodes, run.reference = fp8_nodes, reference
            run.fp8 = [_compare_fp8(n, got[n], in_dtype[i][n], want[n], refs[i][n], atol, rtol)
                       for n in names]
            for out, fp8 in zip(run.outputs, run.fp8):
                out.passed = fp8.passed
        runs.append(run)
    runs[0].more = runs[1:]
    return runs[0]


def _outputs(session, names: list[str], all_feeds: list[dict], rewritten: bool = True) -> list[dict]:
    """The session's outputs ``names`` for each set of feeds, as copies (an output array can keep
    the session's memory arena alive after the session goes); a ``rewritten`` model's interface
    is checked first."""
    if not rewritten:
        return [{n: np.array(x, copy=True) for n, x in zip(names, session.run(names, feeds))}
                for feeds in all_feeds]
    missing = sorted(set(names) - {o.name for o in session.get_outputs()})
    if missing:
        raise ModelMismatchError(f"the rewritten model lacks outputs {missing}")
    extra = sorted({i.name for i in session.get_inputs()} - set(all_feeds[0]))
    if extra:
        raise ModelMismatchError(f"the rewritten model needs inputs the original lacks: {extra}")
    return _outputs(session, names, all_feeds, rewritten=False)


def _fp8_nodes(model: onnx.ModelProto | str | os.PathLike) -> int:
    """How many nodes of the model (any graph) are stamped attention_precision="fp8"."""
    from ort_flash.rewriter.pipeline import PRECISION_ATTRIBUTE

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model), load_external_data=False)
    return sum(1 for _, graph in subgraphs(model.graph) for node in graph.node for a in node.attribute
               if a.name == PRECISION_ATTRIBUTE and a.s == b"fp8")


def _without_fp8(model: onnx.ModelProto | str | os.PathLike) -> tuple[bytes, str | None]:
    """The model with attention_precision removed from every node, serialized, and the folder its
    external data lies in (None for a ModelProto given in memory: the current directory)."""
    from ort_flash.rewriter.pipeline import PRECISION_ATTRIBUTE

    if isinstance(model, onnx.ModelProto):
        proto, folder = onnx.ModelProto(), None
        proto.CopyFrom(model)
    else:
        proto = onnx.load(os.fspath(model), load_external_data=False)
        folder = os.path.dirname(os.path.abspath(os.fspath(model)))
    for _, graph in subgraphs(proto.graph):
        for node in graph.node:
            kept = [a for a in node.attribute if a.name != PRECISION_ATTRIBUTE]
            if len(kept) != len(node.attribute):
                del node.attribute[:]
                node.attribute.extend(kept)
    return proto.SerializeToString(), folder


def _float32_reference(ort, original, names, all_feeds, wants) -> tuple[list[dict], str]:
    """The float32 reference's outputs for each set of feeds, and what the reference is: the
    original converted to float32 (``float32_reference``) on the CPU EP; the original's own
    outputs where it holds no float16 / bfloat16, or where the conversion does not run (saying why)."""
    import tempfile

    from ort_flash import float32_reference

    base_dir = "" if isinstance(original, onnx.ModelProto) else os.path.dirname(os.path.abspath(original))
    try:
        model = float32_reference.float32_model(original, base_dir)
        if model is None:
            return wants, "the original, which computes in float32"
        with tempfile.TemporaryDirectory(prefix="ort_flash_float32_") as folder:
            path = os.path.join(folder, "reference.onnx")
            float32_reference.save(model, path)
            del model
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            session = ort.InferenceSession(path, _one_run(options), providers=["CPUExecutionProvider"])
            refs = _outputs(session, names, [float32_reference.float32_feeds(f) for f in all_feeds],
                            rewritten=False)
            del session
    except Exception as e:  # noqa: BLE001 - ORT's and onnx's exceptions differ; the reason is reported
        return wants, f"the original: its float32 conversion did not run ({first_line(e, 200)})"
    return refs, "the original converted to float32, on the CPU EP"


def _compare_fp8(name, fp8, in_dtype, want, ref, atol, rtol) -> Fp8Comparison:
    """FP8_RULE for one output: the FP8 run ``fp8`` and the model-dtype run ``in_dtype`` against the
    original ``want`` and the float32 reference ``ref``."""
    atol, rtol = _tolerance(_dtype_name(want.dtype), atol, rtol)
    fp8_ref, dtype_ref, original_ref = (_diff(x, ref) for x in (fp8, in_dtype, want))
    allowance = FP8_FACTOR * float(dtype_ref.max(initial=0.0))
    bound = np.maximum(allowance, atol + rtol * np.abs(np.nan_to_num(ref.astype(np.float64))))
    return Fp8Comparison(
        name, fp8_abs=float(_diff(fp8, want).max(initial=0.0)),
        dtype_abs=float(_diff(in_dtype, want).max(initial=0.0)),
        fp8_ref_abs=float(fp8_ref.max(initial=0.0)), dtype_ref_abs=float(dtype_ref.max(initial=0.0)),
        original_ref_abs=float(original_ref.max(initial=0.0)), allowance=allowance,
        dtype_passed=_compare(name, in_dtype, want, atol, rtol).passed,
        fp8_passed=fp8.shape == ref.shape and bool(np.all(fp8_ref <= bound)))


def _one_run(options):
    """Session options for a model run once or twice: weights are not prepacked (a copy of every
    MatMul weight, which saves nothing over one run; without it ONNX Runtime maps external data
    and the session costs the model's size once)."""
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def _compare(name, got, want, atol, rtol) -> OutputComparison:
    dtype = _dtype_name(want.dtype)
    atol, rtol = _tolerance(dtype, atol, rtol)
    if got.shape != want.shape:
        return OutputComparison(name, dtype, list(want.shape), float("inf"), float("inf"),
                                atol, rtol, False)
    diff, b = _diff(got, want), want.astype(np.float64)
    big = np.abs(b) >= max(atol, np.finfo(np.float64).tiny)
    max_abs = float(diff.max(initial=0.0))
    max_rel = float((diff[big] / np.abs(b[big])).max(initial=0.0))
    passed = bool(np.all(diff <= atol + rtol * np.abs(np.nan_to_num(b))))
    return OutputComparison(name, dtype, list(want.shape), max_abs, max_rel, atol, rtol, passed)


def _tolerance(dtype: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """(atol, rtol): the given ones, else TOLERANCES' for the dtype (0: non-float outputs must match)."""
    default = TOLERANCES.get(dtype, (0.0, 0.0))
    return default[0] if atol is None else atol, default[1] if rtol is None else rtol


def _diff(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| elementwise in float64: 0 where both are equal (infinities, NaN in both), inf
    where one side alone is NaN; an array of inf where the shapes differ."""
    if got.shape != want.shape:
        return np.full(want.shape or (1,), np.inf)
    a, b = got.astype(np.float64), want.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    return np.where(np.isnan(diff), np.inf, diff)


def _dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype.name == "bfloat16" else np.dtype(dtype).name


def _source(model: onnx.ModelProto | str | os.PathLike):
    """What InferenceSession takes: a path as it is (external data stays next to it), else bytes."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    return os.fspath(model)
