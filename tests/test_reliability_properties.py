"""Property-based tests of ort_flash.FlashAttention on CPUExecutionProvider (hypothesis).

Valid draws range over dtypes, layouts, head counts, sequence lengths (0 included), head sizes,
caches, masks of every kind and rank, lengths, windows, softcap and scale; each must meet the
error contract of tests/cases.py against the float64 reference. Invalid draws take a valid
case and break one thing; each must raise one error that names the node and the input or
attribute at fault. The budget is small (40 examples each) so that CI stays fast; every run
draws new examples. ORT_FLASH_HYPOTHESIS_EXAMPLES=N runs N per test for a deeper search.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _onnx_models import flash_attention_model, run_model
from _session_runs import session
from cases import check_case, make_inputs

SETTINGS = settings(max_examples=int(os.environ.get("ORT_FLASH_HYPOTHESIS_EXAMPLES", 40)), deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow])
MASK_DIMS = ["qk", "1k", "1qk", "hqk", "h1k", "bhqk", "b1qk", "b11k", "1hqk", "11qk", "bh1k"]
SEEDS = st.integers(0, 2**63 - 1)


@st.composite
def valid_cases(draw, dtypes=("float32", "float16", "bfloat16")):
    hkv = draw(st.integers(1, 3))
    case = dict(
        name="hypothesis",
        dtype=draw(st.sampled_from(dtypes)),
        layout=draw(st.sampled_from(["bnsh", "bsd"])),
        b=draw(st.integers(1, 3)),
        hkv=hkv,
        hq=hkv * draw(st.integers(1, 3)),
        sq=draw(st.integers(0, 40)),
        skv=draw(st.integers(0, 80)),
        d=draw(st.sampled_from([1, 3, 8, 16, 17, 32, 63, 64, 80, 128])),
        causal=draw(st.booleans()),
        lse=draw(st.booleans()),
    )
    if draw(st.booleans()):
        case["dv"] = draw(st.integers(1, 72))
    if draw(st.integers(0, 3)) == 0:
        case["past"] = draw(st.integers(1, 40))
    elif draw(st.booleans()):
        case["nonpad"] = True
    total = case.get("past", 0) + case["skv"]
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["bool", "additive", "finfo"]))
        dims = draw(st.sampled_from(MASK_DIMS))
        case["mask"] = (kind, dims)
        if total > 1 and draw(st.booleans()):
            case["mask_len"] = draw(st.integers(1, total))
        if "q" in dims and case["sq"] > 0 and draw(st.booleans()):
            case["masked_rows"] = True if kind == "bool" else draw(st.sampled_from(["-inf", "finfo"]))
    window = (draw(st.integers(-1, 24)), draw(st.integers(-1, 24)))
    if draw(st.booleans()):
        case["window"] = window
    if draw(st.integers(0, 3)) == 0:
        case["softcap"] = draw(st.floats(0.5, 30.0))
    if draw(st.booleans()):
        case["scale"] = draw(st.floats(0.05, 1.5))
    return case


def _cpu_runner(model, feeds, specs):
    return run_model(model, feeds, specs, ["CPUExecutionProvider"])


@SETTINGS
@given(case=valid_cases(), seed=SEEDS)
def test_valid_inputs_match_the_reference(case, seed):
    check_case(case, _cpu_runner, seed=seed)


# ---- invalid ---------------------------------------------------------------------------------

def _other_float(dtype):
    return np.float16 if dtype == np.float32 else np.float32


def _break(kind, case, feeds, attrs, data):
    """Breaks one thing of a valid case; returns the fragments its error must contain."""
    q, k, v = feeds["Q"], feeds["K"], feeds["V"]
    four_d = q.ndim == 4
    if kind == "kv_heads":  # Hq no longer a multiple of Hkv
        hq, hkv = case["hq"], case["hq"] + 1
        if four_d:
            feeds["K"] = np.zeros(k.shape[:1] + (hkv,) + k.shape[2:], k.dtype)
            feeds["V"] = np.zeros(v.shape[:1] + (hkv,) + v.shape[2:], v.dtype)
        else:
            attrs["kv_num_heads"] = hkv
            feeds["K"] = np.zeros(k.shape[:2] + (hkv * k.shape[2] // case["hkv"],), k.dtype)
            feeds["V"] = np.zeros(v.shape[:2] + (hkv * v.shape[2] // case["hkv"],), v.dtype)
        return ["input 'K'", f"has {hkv} heads", "multiple"]
    if kind == "v_length":
        axis = 2 if four_d else 1
        shape = list(v.shape)
        shape[axis] += data.draw(st.integers(1, 5))
        feeds["V"] = np.zeros(shape, v.dtype)
        return ["input 'V'", "kv sequence"]
    if kind == "k_head_size":
        shape = list(k.shape)
        shape[-1] += case["hkv"] * data.draw(st.integers(1, 3))
        feeds["K"] = np.zeros(shape, k.dtype)
        return ["input 'K'", "head size"]
    if kind == "k_batch":
        feeds["K"] = np.zeros((k.shape[0] + 1,) + k.shape[1:], k.dtype)
        return ["input 'K'", "batch"]
    if kind == "dtype":
        name = data.draw(st.sampled_from(["K", "V"]))
        feeds[name] = feeds[name].astype(_other_float(q.dtype))
        return [f"input '{name}'", "like Q"]
    if kind == "mask_q_axis":  # Sq + 1 is neither 1 nor Sq
        feeds["attn_mask"] = np.zeros((q.shape[2 if four_d else 1] + 1, k.shape[2 if four_d else 1]), bool)
        return ["input 'attn_mask'", "does not broadcast"]
    if kind == "mask_too_long":
        total = k.shape[2 if four_d else 1] + (feeds["past_key"].shape[2] if "past_key" in feeds else 0)
        feeds["attn_mask"] = np.zeros((1, total + data.draw(st.integers(1, 9))), q.dtype)
        return ["input 'attn_mask'", "longer than the keys attended"]
    if kind == "mask_type":
        feeds["attn_mask"] = np.zeros((1, 1), data.draw(st.sampled_from([np.int64, np.int32, _other_float(q.dtype)])))
        return ["input 'attn_mask'", "expected bool or"]
    if kind == "mask_rank":
        feeds["attn_mask"] = np.zeros((1,) * 5, bool)  # rank 1 broadcasts (ONNX Attention)
        return ["input 'attn_mask'", "expected rank 1 to 4"]
    if kind == "past_rank":
        feeds["past_key"] = np.zeros((1, 1, q.shape[-1] if four_d else 4), q.dtype)
        feeds["past_value"] = np.zeros((1, 1, 1, 4), q.dtype)
        feeds.pop("nonpad_kv_seqlen", None)
        return ["input 'past_key'", "expected 4-D"]
    if kind == "nonpad_with_past":
        b = q.shape[0]
        feeds.setdefault("past_key", np.zeros((b, case["hkv"], 2, case["d"]), q.dtype))
        feeds.setdefault("past_value", np.zeros((b, case["hkv"], 2, case["d"]), q.dtype))
        feeds["nonpad_kv_seqlen"] = np.zeros((b,), np.int64)
        return ["input 'nonpad_kv_seqlen'", "cannot be combined with past_key/past_value"]
    if kind == "3d_without_heads":
        attrs.pop("q_num_heads", None)
        attrs.pop("kv_num_heads", None)
        for n in ("Q", "K", "V"):
            a = feeds[n]
            feeds[n] = a.reshape(a.shape[0], a.shape[1], -1) if four_d else a
        return ["3-D Q, K, V need the attributes q_num_heads and kv_num_heads"]
    if kind == "attribute":
        name, value = data.draw(st.one_of(
            st.tuples(st.just("is_causal"), st.sampled_from([-3, -1, 2, 7])),
            st.tuples(st.just("softcap"), st.floats(-1e6, -1e-3)),
            st.tuples(st.just("left_window_size"), st.integers(-100, -2)),
            st.tuples(st.just("right_window_size"), st.integers(-100, -2)),
            st.tuples(st.just("fp32_precision"), st.sampled_from(["fast", "IEEE", "", "tf16", "tf32 "])),
        ))
        attrs[name] = value
        return [f"attribute {name} is", "expected"]
    raise AssertionError(kind)


BREAKS = ["kv_heads", "v_length", "k_head_size", "k_batch", "dtype", "mask_q_axis",
          "mask_too_long", "mask_type", "mask_rank", "past_rank", "nonpad_with_past",
          "3d_without_heads", "attribute"]


@SETTINGS
@given(case=valid_cases(dtypes=("float32", "float16")), kind=st.sampled_from(BREAKS),
       seed=SEEDS, data=st.data())
def test_invalid_inputs_raise_a_clear_error(case, kind, seed, data):
    case = {**case, "sq": max(case["sq"], 1), "skv": max(case["skv"], 1)}
    feeds, attrs, _ = make_inputs(case, np.random.default_rng(seed))
    fragments = _break(kind, case, feeds, attrs, data)
    model = flash_attention_model(feeds, {"Y": feeds["Q"].dtype}, **attrs)
    with pytest.raises(Exception) as excinfo:
        sess = session(model)  # fails here when types, ranks or attributes are wrong
        sess.run(None, feeds)  # else here, once the shapes are known
    text = str(excinfo.value)
    assert "FlashAttention node '" in text, text
    for f in fragments:
        assert f in text, f"{kind}: {f!r} not in {text}"
