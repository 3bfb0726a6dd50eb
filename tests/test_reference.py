"""ort_flash.reference against a direct per-row formula, ONNX's own reference and the spec's pictures."""

import itertools

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ort_flash.reference import attention_lowp, attention_reference, error_bound

RNG = np.random.default_rng()


def naive_attention(q, k, v, mask=None, past=0, nonpad=None, scale=None, causal=False,
                    softcap=0.0, left=-1, right=-1):
    """The spec's words, one query row at a time: 4-D float64 inputs, K/V already present,
    the mask broadcast to (B, Hq, Sq, len)."""
    b, hq, sq, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    y = np.zeros((b, hq, sq, v.shape[3]))
    lse = np.full((b, hq, sq), -np.inf)
    for bi, h, i in itertools.product(range(b), range(hq), range(sq)):
        offset = past if nonpad is None else nonpad[bi] - sq
        pos = i + offset
        hk = h // (hq // hkv)
        scores, values = [], []
        for j in range(t):
            if nonpad is not None and j >= nonpad[bi]:
                continue
            if causal and j > pos:
                continue
            if (left >= 0 and j < pos - left) or (right >= 0 and j > pos + right):
                continue
            s = scale * float(q[bi, h, i] @ k[bi, hk, j])
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            if mask is not None:  # (B, Hq, Sq, len): keys past len are masked
                row = mask[bi, h, i]
                if j >= len(row) or not row[j] or row[j] == -np.inf:
                    continue
                if row.dtype != np.bool_:
                    s += float(row[j])
            scores.append(s)
            values.append(v[bi, hk, j])
        if scores:
            scores = np.array(scores)
            w = np.exp(scores - scores.max())
            y[bi, h, i] = (w / w.sum()) @ np.array(values)
            lse[bi, h, i] = scores.max() + np.log(w.sum())
    return y, lse


def _full_mask(mask, shape):
    """Right-aligned broadcast of a mask to (B, Hq, Sq, len)."""
    return np.broadcast_to(mask, shape[:3] + mask.shape[-1:])


NAIVE_CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, past=3),
    dict(hkv=1, causal=True, nonpad=[9, 2]),
    dict(hkv=2, mask=("bool", (6, 5, 9))),  # rank 3 = (heads, q, kv)
    dict(mask=("float", (2, 1, 5, 7)), causal=True),
    dict(mask=("bool", (2, 1, 1, 9)), causal=True, past=2),
    dict(mask=("float", (5, 6)), nonpad=[6, 4]),
    dict(left=2, right=1),
    dict(left=0, right=-1, causal=True, past=4),
    dict(left=3, right=2, nonpad=[7, 3]),
    dict(softcap=1.5, scale=0.7, causal=True),
    dict(dv=3),
]


@pytest.mark.parametrize("case", NAIVE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_matches_naive_formula(case):
    b, hq, hkv, sq, d, dv = 2, 6, case.get("hkv", 3), 5, 4, case.get("dv", 4)
    past = case.get("past", 0)
    t = 9 - past
    q = RNG.standard_normal((b, hq, sq, d))
    k = RNG.standard_normal((b, hkv, t, d))
    v = RNG.standard_normal((b, hkv, t, dv))
    pk = RNG.standard_normal((b, hkv, past, d)) if past else None
    pv = RNG.standard_normal((b, hkv, past, dv)) if past else None
    mask = None
    if "mask" in case:
        kind, shape = case["mask"]
        mask = RNG.random(shape) < 0.7 if kind == "bool" else np.where(
            RNG.random(shape) < 0.2, -np.inf, RNG.standard_normal(shape))
    nonpad = np.array(case["nonpad"]) if "nonpad" in case else None
    kw = dict(scale=case.get("scale"), is_causal=case.get("causal", False),
              softcap=case.get("softcap", 0.0), left_window_size=case.get("left", -1),
              right_window_size=case.get("right", -1))
    y, present_k, present_v, lse = attention_reference(
        q, k, v, attn_mask=mask, past_key=pk, past_value=pv, nonpad_kv_seqlen=nonpad, **kw)
    full_mask = None if mask is None else _full_mask(mask, (b, hq, sq))
    y_n, lse_n = naive_attention(
        q, present_k, present_v, full_mask, past, nonpad, kw["scale"], kw["is_causal"],
        kw["softcap"], kw["left_window_size"], kw["right_window_size"])
    np.testing.assert_allclose(y, y_n, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, lse_n, rtol=1e-12, atol=1e-12)
    assert present_k.shape == (b, hkv, 9, d) and present_v.shape == (b, hkv, 9, dv)


def _onnx_attention(feeds, **attrs):
    names = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    inputs = [n if n in feeds else "" for n in names]
    while inputs[-1] == "":
        inputs.pop()
    outputs = ["Y", "present_key", "present_value"] if "past_key" in feeds else ["Y"]
    node = helper.make_node("Attention", inputs, outputs,
                            **{k: v for k, v in attrs.items() if v is not None})
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    return ReferenceEvaluator(model).run(None, feeds)


ONNX_CASES = [
    dict(layout3d=True, hkv=2),
    dict(causal=True, past=6),
    dict(causal=True, nonpad=True),
    dict(mask=("bool", (2, 4, 7, 10))),
    dict(mask=("float", (4, 7, 13)), causal=True),  # rank 3 = (heads, q, kv)
    dict(mask=("bool", (7, 8)), nonpad=True),       # shorter than kv
    # A mask of query extent 1 with is_causal is left out: onnx 1.23's reference takes the
    # causal frontier's Sq from the mask (so every row gets row 0's frontier), against the
    # spec's words; the naive test covers that case.
    dict(mask=("float", (2, 1, 7, 13)), past=3, causal=True, layout3d=True),
    dict(mask=("float", (2, 1, 1, 13)), past=3, layout3d=True),
    dict(left=3, right=2, past=5),
    dict(left=4, right=0, causal=True, nonpad=True, mask=("float", (1, 4, 7, 13))),
    dict(softcap=3.0, scale=0.25, hkv=1, causal=True),  # onnx uses float32(sqrt(scale))
]


@pytest.mark.parametrize("case", ONNX_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_matches_onnx_reference(case):
    b, hq, hkv, sq, d, dv = 2, 4, case.get("hkv", 4), 7, 8, 6
    past = case.get("past", 0)
    t = 13 - past
    q = RNG.standard_normal((b, hq, sq, d))
    k = RNG.standard_normal((b, hkv, t, d))
    v = RNG.standard_normal((b, hkv, t, dv))
    feeds = {"Q": q, "K": k, "V": v}
    heads = {}
    if case.get("layout3d"):
        feeds = {"Q": q.transpose(0, 2, 1, 3).reshape(b, sq, hq * d),
                 "K": k.transpose(0, 2, 1, 3).reshape(b, t, hkv * d),
                 "V": v.transpose(0, 2, 1, 3).reshape(b, t, hkv * dv)}
        heads = dict(q_num_heads=hq, kv_num_heads=hkv)
    if "mask" in case:
        kind, shape = case["mask"]
        feeds["attn_mask"] = RNG.random(shape) < 0.7 if kind == "bool" else np.where(
            RNG.random(shape) < 0.2, -np.inf, RNG.standard_normal(shape))
    if past:
        feeds["past_key"] = RNG.standard_normal((b, hkv, past, d))
        feeds["past_value"] = RNG.standard_normal((b, hkv, past, dv))
    if case.get("nonpad"):
        feeds["nonpad_kv_seqlen"] = np.array([13, 5], dtype=np.int64)
    attrs = dict(scale=case.get("scale"), is_causal=int(case.get("causal", False)),
                 softcap=case.get("softcap"), left_window_size=case.get("left"),
                 right_window_size=case.get("right"), **heads)
    expected = _onnx_attention(feeds, **attrs)
    y, present_k, present_v, _ = attention_reference(
        feeds["Q"], feeds["K"], feeds["V"], attn_mask=feeds.get("attn_mask"),
        past_key=feeds.get("past_key"), past_value=feeds.get("past_value"),
        nonpad_kv_seqlen=feeds.get("nonpad_kv_seqlen"), scale=attrs["scale"],
        is_causal=bool(attrs["is_causal"]), softcap=case.get("softcap", 0.0),
        left_window_size=case.get("left", -1), right_window_size=case.get("right", -1), **heads)
    assert y.shape == expected[0].shape
    np.testing.assert_allclose(y, expected[0], rtol=0, atol=1e-12)
    if past:
        np.testing.assert_array_equal(present_k, expected[1])
        np.testing.assert_array_equal(present_v, expected[2])


def _pattern(rows):
    return np.array([[c == "#" for c in r] for r in rows])


# The pictures of the ONNX Attention-25 doc: (Sq, Sk, reference kwargs, attended keys).
SPEC_PICTURES = {
    "causal_nonpad4": (4, 8, dict(is_causal=True, nonpad_kv_seqlen=np.array([4])),
                       ["#.......", "##......", "###.....", "####...."]),
    "causal_nonpad8": (4, 8, dict(is_causal=True, nonpad_kv_seqlen=np.array([8])),
                       ["#####...", "######..", "#######.", "########"]),
    "window_2_1": (4, 6, dict(left_window_size=2, right_window_size=1),
                   ["##....", "###...", "####..", ".####."]),
}


@pytest.mark.parametrize("name", SPEC_PICTURES)
def test_spec_pictures(name):
    sq, sk, kwargs, rows = SPEC_PICTURES[name]
    q = np.zeros((1, 1, sq, 4))  # equal scores: y row = uniform weights over attended keys
    k = RNG.standard_normal((1, 1, sk, 4))
    v = np.eye(sk)[None, None]
    y, _, _, lse = attention_reference(q, k, v, **kwargs)
    expected = _pattern(rows)
    np.testing.assert_array_equal(y[0, 0] > 0, expected)
    np.testing.assert_allclose(y[0, 0].sum(-1), 1.0)
    np.testing.assert_allclose(lse[0, 0], np.log(expected.sum(-1)))


def test_fully_masked_rows():
    q = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    k = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    finfo_min = np.finfo(np.float32).min
    mask = np.zeros((3, 5), np.float32)
    mask[0] = -np.inf          # fully masked: y = 0, lse = -inf
    mask[1] = finfo_min        # finfo.min everywhere: uniform weights (the scores vanish)
    with np.errstate(all="raise"):
        y, _, _, lse = attention_reference(q, k, v, attn_mask=mask)
    assert np.all(y[:, :, 0] == 0) and np.all(np.isneginf(lse[:, :, 0]))
    np.testing.assert_allclose(y[:, :, 1], v.astype(np.float64).mean(axis=2), atol=1e-12)
    assert np.all(np.isfinite(lse[:, :, 1:]))
    # every key dropped by a causal window -> fully masked; skv == 0 -> all rows masked
    y, _, _, lse = attention_reference(q, k, v, is_causal=True,
                                       nonpad_kv_seqlen=np.array([1]))
    assert np.all(y[:, :, :2] == 0) and np.all(np.isneginf(lse[:, :, :2]))
    y, _, _, lse = attention_reference(q, k[:, :, :0], v[:, :, :0])
    assert y.shape == (1, 2, 3, 4) and not y.any() and np.all(np.isneginf(lse))


def test_layout_3d_matches_4d():
    b, hq, hkv, s, d, dv = 2, 6, 2, 5, 4, 3
    q = RNG.standard_normal((b, hq, s, d))
    k = RNG.standard_normal((b, hkv, s, d))
    v = RNG.standard_normal((b, hkv, s, dv))
    y4, pk4, _, lse4 = attention_reference(q, k, v, is_causal=True)
    to3 = lambda x: x.transpose(0, 2, 1, 3).reshape(b, s, -1)  # noqa: E731
    y3, pk3, _, lse3 = attention_reference(to3(q), to3(k), to3(v), is_causal=True,
                                           q_num_heads=hq, kv_num_heads=hkv)
    np.testing.assert_allclose(y3, to3(y4), atol=1e-14)
    np.testing.assert_array_equal(pk3, pk4)
    np.testing.assert_array_equal(lse3, lse4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_lowp_is_the_same_function_in_low_precision(dtype):
    shape = (2, 4, 33, 16)
    q, k, v = (RNG.standard_normal(shape).astype(np.float32).astype(dtype) for _ in range(3))
    mask = RNG.random((33, 33)) < 0.8
    kw = dict(attn_mask=mask, is_causal=True, softcap=4.0)
    y, _, _, lse = attention_reference(q, k, v, **kw)
    y_low, pk, _, lse_low = attention_lowp(q, k, v, **kw)
    assert y_low.dtype == dtype and lse_low.dtype == np.float32 and pk.dtype == dtype
    err = np.abs(y_low.astype(np.float64) - y).max()
    eps = float(ml_dtypes.finfo(dtype).eps)
    assert eps / 100 < err < 20 * eps  # rounded at every stage, not more
    np.testing.assert_array_equal(np.isneginf(lse_low), np.isneginf(lse))
    assert error_bound(y, y_low, 1e-3) == pytest.approx(2 * err + 1e-3)
