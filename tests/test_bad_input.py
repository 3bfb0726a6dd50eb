"""Bad input to ort_flash.FlashAttention: every case fails with one message that names the node,
the input (or attribute) and what was expected; at session creation where the graph records
the shapes, at run time where they are symbolic; never a crash.

Each case of BAD lists the inputs as (dtype, shape), the attributes, the message fragments and
whether the mistake is visible without shapes (types, ranks, attributes: "types"), so that even
a fully symbolic model fails at creation, or only with concrete shapes ("shapes").
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from _session_runs import run_bound, session, static_model
from ort_flash.reference import attention_reference

F32, F16, BF16, F64 = np.float32, np.float16, ml_dtypes.bfloat16, np.float64
BOOL, I64, I32 = np.bool_, np.int64, np.int32
NODE = "FlashAttention node 'attn0'"


def qkv(q=(1, 4, 5, 8), k=(1, 4, 7, 8), v=(1, 4, 7, 8), dtype=F32, **more):
    return {"Q": (dtype, q), "K": (dtype, k), "V": (dtype, v), **more}


# (id, inputs, attrs, fragments, visible_without_shapes)
BAD = [
    # heads
    ("q_heads_not_multiple_of_kv", qkv(q=(1, 6, 5, 8)), {}, ["input 'K'", "has 4 heads", "multiple"], False),
    ("k_v_heads_differ", qkv(v=(1, 2, 7, 8)), {}, ["input 'V'", "kv heads", "expected 4"], False),
    ("zero_kv_heads", qkv(k=(1, 0, 7, 8), v=(1, 0, 7, 8)), {}, ["input 'K'", "zero heads"], False),
    ("q_num_heads_disagrees_4d", qkv(), {"q_num_heads": 3}, ["q_num_heads=3", "Q's head axis (4)"], False),
    ("kv_num_heads_disagrees_4d", qkv(), {"kv_num_heads": 2}, ["kv_num_heads=2", "K's head axis (4)"], False),
    # sizes
    ("k_head_size", qkv(k=(1, 4, 7, 9)), {}, ["input 'K'", "head size", "expected 8"], False),
    ("k_batch", qkv(k=(2, 4, 7, 8)), {}, ["input 'K'", "batch", "expected 1"], False),
    ("v_kv_sequence", qkv(v=(1, 4, 6, 8)), {}, ["input 'V'", "kv sequence", "expected 7"], False),
    # dtypes
    ("mixed_k_float16", qkv(K=(F16, (1, 4, 7, 8))), {}, ["input 'K'", "is float16", "expected float32 like Q"], True),
    ("mixed_v_bfloat16", qkv(dtype=F16, V=(BF16, (1, 4, 7, 8))), {}, ["input 'V'", "is bfloat16", "expected float16 like Q"], True),
    ("mixed_mask_float16", qkv(attn_mask=(F16, (5, 7))), {}, ["input 'attn_mask'", "is float16", "expected bool or float32"], True),
    ("mask_int64", qkv(attn_mask=(I64, (5, 7))), {}, ["input 'attn_mask'", "is int64", "expected bool or float32"], True),
    ("mixed_past_key", qkv(past_key=(F16, (1, 4, 3, 8)), past_value=(F32, (1, 4, 3, 8))), {},
     ["input 'past_key'", "is float16", "expected float32 like Q"], True),
    ("nonpad_int32", qkv(nonpad_kv_seqlen=(I32, (1,))), {}, ["input 'nonpad_kv_seqlen'", "is int32", "expected int64"], True),
    # masks
    ("mask_q_axis", qkv(attn_mask=(F32, (3, 7))), {}, ["input 'attn_mask'", "does not broadcast", "q sequence axis is 3, expected 1 or 5"], False),
    ("mask_head_axis", qkv(attn_mask=(BOOL, (1, 3, 5, 7))), {}, ["input 'attn_mask'", "does not broadcast", "q heads axis is 3, expected 1 or 4"], False),
    ("mask_batch_axis", qkv(attn_mask=(F32, (2, 1, 5, 7))), {}, ["input 'attn_mask'", "batch axis is 2, expected 1 or 1"], False),
    ("mask_key_axis_too_long", qkv(attn_mask=(F32, (5, 9))), {}, ["input 'attn_mask'", "key axis (9) is longer than the keys attended (7)"], False),
    ("mask_rank_5", qkv(attn_mask=(F32, (1, 1, 1, 5, 7))), {}, ["input 'attn_mask'", "expected rank 1 to 4"], True),
    # layouts
    ("3d_without_head_counts", qkv(q=(1, 5, 32), k=(1, 7, 32), v=(1, 7, 32)), {},
     ["3-D Q, K, V need the attributes q_num_heads and kv_num_heads"], True),
    ("3d_only_q_num_heads", qkv(q=(1, 5, 32), k=(1, 7, 32), v=(1, 7, 32)), {"q_num_heads": 4},
     ["3-D Q, K, V need the attributes q_num_heads and kv_num_heads", "got 4, 0"], True),
    ("3d_hidden_not_multiple", qkv(q=(1, 5, 30), k=(1, 7, 32), v=(1, 7, 32)), {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'Q'", "hidden size 30 is not a multiple of q_num_heads=4"], False),
    ("3d_k_head_size", qkv(q=(1, 5, 32), k=(1, 7, 48), v=(1, 7, 32)), {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'K'", "head size 12", "expected Q's head size 8"], False),
    ("k_rank_differs", qkv(k=(1, 7, 32)), {}, ["input 'K'", "has rank 3", "expected rank 4 like Q"], True),
    ("q_rank_5", qkv(q=(1, 1, 4, 5, 8), k=(1, 1, 4, 7, 8), v=(1, 1, 4, 7, 8)), {}, ["input 'Q'", "expected 4-D (B, Hq, Sq, D) or 3-D"], True),
    # packed QKV (K and V omitted)
    ("v_without_k", {"Q": (F32, (1, 5, 32)), "V": (F32, (1, 5, 32))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'K'", "is missing", "V cannot be given without K"], True),
    ("packed_without_head_counts", {"Q": (F32, (1, 5, 96))}, {},
     ["packed QKV (K and V omitted) needs the attributes q_num_heads and kv_num_heads", "got 0, 0"], True),
    ("packed_4d", {"Q": (F32, (1, 4, 5, 24))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'Q'", "packed QKV", "expected 3-D (B, S, (4 + 2*4) * D)"], True),
    ("packed_width_not_multiple", {"Q": (F32, (1, 5, 100))}, {"q_num_heads": 4, "kv_num_heads": 2},
     ["input 'Q'", "packed QKV width 100 is not a multiple of q_num_heads + 2*kv_num_heads = 8"], False),
    ("packed_head_size_12", {"Q": (F32, (1, 5, 96))}, {"q_num_heads": 4, "kv_num_heads": 2},
     ["input 'Q'", "packed QKV has head size 12", "multiple of 8"], False),
    ("packed_with_past", {"Q": (F32, (1, 5, 96)), "past_key": (F32, (1, 4, 3, 8)), "past_value": (F32, (1, 4, 3, 8))},
     {"q_num_heads": 4, "kv_num_heads": 4}, ["input 'past_key'", "cannot be combined with packed QKV"], True),
    ("packed_mask_q_axis", {"Q": (F32, (1, 5, 96)), "attn_mask": (F32, (3, 5))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'attn_mask'", "q sequence axis is 3, expected 1 or 5"], False),
    # packed KV (V omitted)
    ("kv_packed_width", {"Q": (F32, (1, 5, 32)), "K": (F32, (1, 7, 32))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'K'", "packed KV", "expected 2 * kv_num_heads * D = 2*4*8 = 64"], False),
    ("kv_packed_without_head_counts", {"Q": (F32, (1, 5, 32)), "K": (F32, (1, 7, 64))}, {},
     ["packed KV (V omitted) needs the attributes q_num_heads and kv_num_heads", "got 0, 0"], True),
    ("kv_packed_4d_q", {"Q": (F32, (1, 4, 5, 8)), "K": (F32, (1, 7, 64))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'Q'", "packed KV", "expected 3-D (B, Sq, 4 * D)"], True),
    ("kv_packed_4d_k", {"Q": (F32, (1, 5, 32)), "K": (F32, (1, 4, 7, 16))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'K'", "packed KV", "expected 3-D (B, Skv, 2*4 * D)"], True),
    ("kv_packed_head_size_12", {"Q": (F32, (1, 5, 48)), "K": (F32, (1, 7, 96))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'Q'", "head size 12", "packed KV needs a multiple of 8"], False),
    ("kv_packed_batch", {"Q": (F32, (1, 5, 32)), "K": (F32, (2, 7, 64))}, {"q_num_heads": 4, "kv_num_heads": 4},
     ["input 'K'", "batch", "expected 1"], False),
    ("kv_packed_with_past", {"Q": (F32, (1, 5, 32)), "K": (F32, (1, 7, 64)), "past_key": (F32, (1, 4, 3, 8)),
                             "past_value": (F32, (1, 4, 3, 8))},
     {"q_num_heads": 4, "kv_num_heads": 4}, ["input 'past_key'", "cannot be combined with packed KV"], True),
    # caches
    ("past_key_rank_3", qkv(past_key=(F32, (1, 4, 8)), past_value=(F32, (1, 4, 3, 8))), {},
     ["input 'past_key'", "expected 4-D (B, Hkv, P, D)"], True),
    ("past_value_rank_5", qkv(past_key=(F32, (1, 4, 3, 8)), past_value=(F32, (1, 4, 3, 8, 1))), {},
     ["input 'past_value'", "expected 4-D (B, Hkv, P, Dv)"], True),
    ("past_key_head_size", qkv(past_key=(F32, (1, 4, 3, 16)), past_value=(F32, (1, 4, 3, 8))), {},
     ["input 'past_key'", "head size D", "expected 8"], False),
    ("past_lengths_differ", qkv(past_key=(F32, (1, 4, 3, 8)), past_value=(F32, (1, 4, 2, 8))), {},
     ["input 'past_value'", "past length", "expected 3"], False),
    ("past_key_without_value", qkv(past_key=(F32, (1, 4, 3, 8))), {}, ["input 'past_value'", "is missing", "go together"], True),
    ("nonpad_with_past", qkv(past_key=(F32, (1, 4, 3, 8)), past_value=(F32, (1, 4, 3, 8)), nonpad_kv_seqlen=(I64, (1,))), {},
     ["input 'nonpad_kv_seqlen'", "cannot be combined with past_key/past_value"], True),
    ("nonpad_rank_2", qkv(nonpad_kv_seqlen=(I64, (1, 1))), {}, ["input 'nonpad_kv_seqlen'", "expected (B,)"], True),
    ("nonpad_batch", qkv(nonpad_kv_seqlen=(I64, (2,))), {}, ["input 'nonpad_kv_seqlen'", "batch", "expected 1"], False),
    # attributes
    ("fp32_precision_fast", qkv(), {"fp32_precision": "fast"}, ["fp32_precision is 'fast'", "expected 'ieee' or 'tf32'"], True),
    ("fp32_precision_tf32x3", qkv(), {"fp32_precision": "tf32x3"}, ["fp32_precision is 'tf32x3'", "expected 'ieee' or 'tf32'"], True),
    ("fp32_precision_empty", qkv(), {"fp32_precision": ""}, ["fp32_precision is ''", "expected 'ieee' or 'tf32'"], True),
    ("attention_precision_fp16", qkv(), {"attention_precision": "fp16"},
     ["attention_precision is 'fp16'", "expected 'model' or 'fp8'"], True),
    ("attention_precision_FP8", qkv(), {"attention_precision": "FP8"},
     ["attention_precision is 'FP8'", "expected 'model' or 'fp8'"], True),
    ("is_causal_2", qkv(), {"is_causal": 2}, ["is_causal is 2", "expected 0 or 1"], True),
    ("is_causal_minus_1", qkv(), {"is_causal": -1}, ["is_causal is -1", "expected 0 or 1"], True),
    ("softcap_negative", qkv(), {"softcap": -1.0}, ["softcap is -1", "expected a finite value >= 0"], True),
    ("softcap_nan", qkv(), {"softcap": float("nan")}, ["softcap is nan", "expected a finite value >= 0"], True),
    ("softcap_inf", qkv(), {"softcap": float("inf")}, ["softcap is inf", "expected a finite value >= 0"], True),
    ("scale_inf", qkv(), {"scale": float("inf")}, ["scale is inf", "expected a finite value"], True),
    ("left_window_minus_2", qkv(), {"left_window_size": -2}, ["left_window_size is -2", "expected -1 (unbounded) or >= 0"], True),
    ("right_window_minus_5", qkv(), {"right_window_size": -5}, ["right_window_size is -5", "expected -1 (unbounded) or >= 0"], True),
    ("qk_matmul_output_mode", qkv(), {"qk_matmul_output_mode": 1}, ["qk_matmul_output_mode is not supported"], True),
]
IDS = [c[0] for c in BAD]


def _error_text(excinfo) -> str:
    return str(excinfo.value)


def _assert_names(text: str, fragments, node=NODE):
    assert node in text, text
    for f in fragments:
        assert f in text, f"{f!r} not in: {text}"
    assert "Traceback" not in text


def _feeds(inputs, rng) -> dict:
    feeds = {}
    for name, (dtype, shape) in inputs.items():
        if np.dtype(dtype).kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == BOOL:
            feeds[name] = np.ones(shape, bool)
        else:
            feeds[name] = np.full(shape, 3, dtype)
    return feeds


@pytest.mark.parametrize("case", BAD, ids=IDS)
def test_static_shapes_fail_at_session_creation(case):
    _, inputs, attrs, fragments, _ = case
    model = static_model(inputs, **attrs)
    with pytest.raises(Exception) as excinfo:
        session(model)
    _assert_names(_error_text(excinfo), fragments)


@pytest.mark.parametrize("case", BAD, ids=IDS)
def test_symbolic_shapes_fail_at_creation_or_run(case):
    _, inputs, attrs, fragments, visible_without_shapes = case
    model = static_model({n: (dt, [None] * len(s)) for n, (dt, s) in inputs.items()}, **attrs)
    if visible_without_shapes:
        with pytest.raises(Exception) as excinfo:
            session(model)
    else:
        sess = session(model)  # the shapes are unknown until run time
        with pytest.raises(Exception) as excinfo:
            sess.run(None, _feeds(inputs, np.random.default_rng(0)))
        assert "Non-zero status code returned while running FlashAttention node" in _error_text(excinfo)
    _assert_names(_error_text(excinfo), fragments)


def test_unsupported_q_type_names_node_and_input():
    # No FlashAttention kernel is registered for float64 Q: ONNX Runtime's own type check
    # rejects the node at creation, naming the node and the input.
    with pytest.raises(Exception) as excinfo:
        session(static_model(qkv(dtype=F64)))
    _assert_names(_error_text(excinfo), ["tensor(double)", "(Q)"], node="(attn0)")


def test_present_outputs_with_nonpad_fail_at_creation():
    model = static_model(qkv(nonpad_kv_seqlen=(I64, (1,))),
                         outputs={"Y": F32, "present_key": F32, "present_value": F32})
    with pytest.raises(Exception) as excinfo:
        session(model)
    _assert_names(_error_text(excinfo), ["present_key/present_value cannot be combined with nonpad_kv_seqlen"])


def test_present_outputs_with_packed_qkv_fail_at_creation():
    model = static_model({"Q": (F32, (1, 5, 96))}, outputs={"Y": F32, "present_key": F32, "present_value": F32},
                         q_num_heads=4, kv_num_heads=4)
    with pytest.raises(Exception) as excinfo:
        session(model)
    _assert_names(_error_text(excinfo), ["present_key/present_value need K and V inputs", "packed QKV"])


def test_present_outputs_with_packed_kv_fail_at_creation():
    model = static_model({"Q": (F32, (1, 5, 32)), "K": (F32, (1, 5, 64))},
                         outputs={"Y": F32, "present_key": F32, "present_value": F32},
                         q_num_heads=4, kv_num_heads=4)
    with pytest.raises(Exception) as excinfo:
        session(model)
    _assert_names(_error_text(excinfo), ["present_key/present_value need K and V inputs", "packed KV"])


def test_shape_errors_leave_the_session_usable():
    # A failed run leaves no state behind: the next good run of the same session is correct.
    model = static_model({n: (F32, [None] * 4) for n in ("Q", "K", "V")})
    sess = session(model)
    rng = np.random.default_rng(1)
    good = _feeds(qkv(), rng)
    want = attention_reference(good["Q"], good["K"], good["V"])[0]
    for _ in range(3):
        with pytest.raises(Exception, match="input 'V'"):
            sess.run(None, _feeds(qkv(v=(1, 4, 6, 8)), rng))
        (y,) = sess.run(None, good)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_head_size_above_256_runs_on_cpu():
    # Only the CUDA kernels are limited to 256; the CPU kernel takes any head size.
    rng = np.random.default_rng(2)
    feeds = _feeds(qkv(q=(1, 2, 9, 320), k=(1, 2, 11, 320), v=(1, 2, 11, 300)), rng)
    sess = session(static_model({n: (F32, a.shape) for n, a in feeds.items()}))
    y = run_bound(sess, feeds, {"Y": ((1, 2, 9, 300), F32)})["Y"]
    np.testing.assert_allclose(y, attention_reference(feeds["Q"], feeds["K"], feeds["V"])[0],
                               rtol=1e-5, atol=1e-5)


CUDA = ["CUDAExecutionProvider"]


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(320, 320), (64, 300), (257, 64)], ids=["d320", "dv300", "d257"])
def test_head_size_above_256_fails_on_cuda(dims):
    d, dv = dims
    inputs = qkv(q=(1, 2, 9, d), k=(1, 2, 11, d), v=(1, 2, 11, dv))
    which = "input 'Q'" if d > 256 else "input 'V'"
    with pytest.raises(Exception) as excinfo:  # static shapes: at creation
        session(static_model(inputs), providers=CUDA)
    _assert_names(_error_text(excinfo), [which, f"head size {max(d, dv)}", "up to 256"])
    sess = session(static_model({n: (dt, [None] * 4) for n, (dt, _) in inputs.items()}), providers=CUDA)
    with pytest.raises(Exception) as excinfo:  # symbolic shapes: at run time
        sess.run(None, _feeds(inputs, np.random.default_rng(3)))
    _assert_names(_error_text(excinfo), [which, f"head size {max(d, dv)}", "up to 256"])


# The worst inputs in a child process: a crash (segfault, abort, sanitizer report) shows up as
# its exit code, which a test in the same process could not report.
CHILD = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import test_bad_input as t
from _session_runs import session, static_model

rng = np.random.default_rng(0)
failed = 0
for name, inputs, attrs, fragments, visible in t.BAD:
    if visible:
        continue
    model = static_model({{n: (dt, [None] * len(s)) for n, (dt, s) in inputs.items()}}, **attrs)
    sess = session(model)
    for _ in range(3):
        try:
            sess.run(None, t._feeds(inputs, rng))
        except Exception:
            failed += 1
# Inputs that are valid but extreme: lengths past the keys, negative lengths, empty axes.
model = static_model({{n: (np.float32, [None] * 4) for n in ("Q", "K", "V")}} |
                     {{"nonpad_kv_seqlen": (np.int64, [None]), "attn_mask": (np.bool_, [None] * 2)}},
                     is_causal=1)
sess = session(model)
for lens, sq, skv, mlen in [(2**62, 5, 7, 7), (-(2**62), 5, 7, 7), (0, 5, 7, 0), (3, 0, 7, 7),
                            (3, 5, 0, 0), (7, 1, 7, 3)]:
    feeds = t._feeds(t.qkv(q=(2, 4, sq, 8), k=(2, 4, skv, 8), v=(2, 4, skv, 8),
                           attn_mask=(np.bool_, (sq, mlen)),
                           nonpad_kv_seqlen=(np.int64, (2,))), rng)
    feeds["nonpad_kv_seqlen"][:] = lens
    (y,) = sess.run(None, feeds)
    assert np.isfinite(y).all(), (lens, sq, skv, mlen)
print("survived", failed, "failed runs")
"""


def test_bad_runs_do_not_crash_the_process():
    tests = str(Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(tests=tests))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    expected = 3 * sum(not c[4] for c in BAD)
    assert f"survived {expected} failed runs" in proc.stdout, proc.stdout + proc.stderr[-2000:]
