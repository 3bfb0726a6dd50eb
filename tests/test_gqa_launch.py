"""GroupQueryAttention's CUDA path with no GPU: cpp/gqa_launch.cc (what the op runs on the CUDA EP)
over the fake CUDA driver (tests/fake_cuda, tests/_fake_cuda.py), which loads this build's real
cubins and lays out each launch's parameters by the cubin's own table. Checked: the scratch block
(rotated Q, lengths, key mask, with attention sinks the log-sum-exp, with a windowed cache its
stage), the prepare kernels' grids, blocks, shared memory and every argument, the attention launch
that follows, reading the Q, lengths and mask the prepare kernel wrote (a windowed cache: the
stage, then the compaction into present; where no row can pass the cache's capacity, or for one
new token, present in place of the stage, past the capacity after the shift of the kept rows),
and with attention sinks (head_sink, smooth_softmax=1) the attention storing its log-sum-exp and
the rescale kernel launched after it on that buffer;
what the op's CUDA kernel creation checks; the errors it gives instead of launching. The kernels'
arithmetic is tests/test_gqa_prepare_kernel.py's and tests/test_sink_rescale_kernel.py's
(interpreter) and the GPU suite's."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import _fake_cuda  # noqa: E402
from test_launch_abi import ARCH, SMS, Log, _fwd_expected, abi_names, decode_params, f32  # noqa: E402

_C = pytest.importorskip("ort_flash._C", reason="the native module is not built")
KERNELS = _C.kernels()
pytestmark = [
    pytest.mark.skipif(not KERNELS, reason="a CPU-only build (ORT_FLASH_CUDA_ARCHS empty): no CUDA kernels to launch"),
    pytest.mark.skipif(_fake_cuda.compiler() is None, reason="no C compiler to build the fake CUDA driver"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fake driver is an ELF shared library"),
]
STREAM = 5
ES = {"float16": 2, "bfloat16": 2, "float32": 4}
SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def block_d(d: int) -> int:
    """The prepare kernels' BLOCK_D for head size d (cpp/gqa_launch.cc gqa_kernel)."""
    return min(x for x in (64, 128, 256) if x >= d)

_CHILD = """
import json, os, sys
from ort_flash import _C
job = json.load(sys.stdin)
out = []
for dtype in ("float16", "bfloat16", "float32"):
    _C.gqa_cuda_ready(0, dtype, sinks=True, windowed=True)
for i, call in enumerate(job["calls"]):
    with open(os.environ["FAKE_CUDA_LOG"], "a") as f:
        f.write(json.dumps({"ev": "call", "index": i}) + "\\n")
    try:
        _C.run_gqa_cuda(call, job["stream"])
        out.append(None)
    except RuntimeError as e:
        out.append(str(e))
print(json.dumps(out))
"""


def gqa_call(dtype="float16", b=2, s=7, hq=8, hkv=2, d=128, total=7, past_len=64, shared=True, packed=True,
             rotary_dim=64, interleaved=0, position_ids=False, **kw) -> dict:
    """A call of fake device pointers, 16 MiB apart (past_len 0: no past; a windowed cache,
    sliding_window_cache=1: present has the past's length)."""
    c = dict(dtype=dtype, batch=b, sq=s, hq=hq, hkv=hkv, d=d, packed=int(packed), total_sequence_length=total,
             present_len=past_len if kw.get("sliding_window_cache") else max(total, past_len), past_len=past_len, rotary_dim=rotary_dim,
             rotary_interleaved=interleaved, max_position=4096 if rotary_dim else 0,
             query=0x1000000, seqlens_k=0x3000000, output=0x4000000, present_key=0x5000000,
             present_value=0x6000000)
    if not packed:
        c.update(key=0x7000000, value=0x8000000)
    if rotary_dim:
        c.update(cos_cache=0x9000000, sin_cache=0xa000000)
    if position_ids:
        c["position_ids"] = 0xb000000
    if past_len:
        c.update(past_key=0x5000000, past_value=0x6000000) if shared else c.update(past_key=0xc000000,
                                                                                     past_value=0xd000000)
    c.update(kw)
    return c


def aligned(n: int) -> int:
    return -(-n // 256) * 256


def has_sinks(c: dict) -> bool:
    """The call applies attention sinks (head_sink or smooth_softmax=1; a window of 0 keys, whose
    rows are all 0, none)."""
    return ("head_sink" in c or c.get("smooth_softmax", -1) == 1) and c.get("local_window_size", -1) != 0


def windowed(c: dict) -> bool:
    return bool(c.get("sliding_window_cache"))


def shared_cache(c: dict) -> bool:
    """past_key / past_value are present_key / present_value's buffers."""
    return c.get("past_key") == c["present_key"] and c.get("past_value") == c["present_value"]


def full_window(c: dict) -> bool:
    """A windowed cache's decode step (S = 1) whose rows may pass its capacity C: present is the
    stage, each row's kept rows moved down (a shared buffer by the shift kernel); past and present
    one buffer each or four distinct ones. The launches below run with the default switches (the
    shift at every batch; ORT_FLASH_WINDOW_SHIFT=0, the stage, has a test of its own)."""
    distinct = len({c.get("past_key"), c.get("past_value"), c["present_key"], c["present_value"]}) == 4
    return (windowed(c) and c["total_sequence_length"] > c["present_len"] and c["sq"] == 1
            and (shared_cache(c) or distinct))


def staged(c: dict) -> bool:
    """A windowed cache whose rows may pass its capacity C (total_sequence_length > C) by more than
    one token: each row's resident rows and new tokens go to a stage of C + S rows in the scratch
    block."""
    return windowed(c) and c["total_sequence_length"] > c["present_len"] and not full_window(c)


def in_place(c: dict) -> bool:
    """A windowed cache no row can pass (total_sequence_length <= C): present is the stage."""
    return windowed(c) and not staged(c)


def causal_first(c: dict) -> bool:
    """A causal first prompt (S = total_sequence_length) into a cache that is not windowed."""
    return c["sq"] == c["total_sequence_length"] and c.get("causal", 1) != 0 and not windowed(c)


def key_mask(c: dict) -> bool:
    """The prepare kernel writes a key mask: a causal first prompt of several rows (their lengths
    live on the device). One row holds S tokens and runs as a plain causal call."""
    return causal_first(c) and c["batch"] > 1


def rotary_on_load(c: dict, kind: str) -> bool:
    """The attention kernel turns Q by its rotary as it loads Q, so the prepare kernel writes no Q
    (cpp/gqa_launch.cc rotary_on_load): a first prompt with half-split rotary over the whole head,
    no position_ids, no Q norm and no windowed cache, 16-byte aligned cos/sin, on a Gluon kernel
    (`kind`, the attention's)."""
    return (kind == "fwd_gluon" and c["sq"] == c["total_sequence_length"] and c["rotary_dim"] == c["d"]
            and not c["rotary_interleaved"] and "position_ids" not in c and "q_norm_weight" not in c
            and not windowed(c) and (c["cos_cache"] | c["sin_cache"]) % 16 == 0)


def stage_bytes(c: dict) -> int:
    """One of a staged windowed cache's two stages: (B, Hkv, C + S, D)."""
    return c["batch"] * c["hkv"] * (c["present_len"] + c["sq"]) * c["d"] * ES[c["dtype"]] if staged(c) else 0


def shift_rows(c: dict) -> int:
    """The shift kernel's block of rows (BLOCK_ROWS): 2048 elements of the smallest BLOCK_D."""
    return 2048 // block_d(c["d"])


def save_bytes(c: dict) -> int:
    """One of the shift's two save buffers: min(G, BLOCK_ROWS) rows for each block of BLOCK_ROWS of
    each (batch row, KV head)."""
    if not (full_window(c) and shared_cache(c)):
        return 0
    rows, gap = shift_rows(c), c["present_len"] - c["local_window_size"] + 1
    return c["batch"] * c["hkv"] * math.ceil(c["present_len"] / rows) * min(gap, rows) * c["d"] * ES[c["dtype"]]


def scratch_layout(c: dict, q_bytes: int) -> tuple[int, int, int]:
    """(bytes of the scratch block, offset of the log-sum-exp in it, 0 without sinks; offset of the
    stage K, 0 without a staged windowed cache, else of the shift's save K, 0 without the shift): the
    rotated Q, the lengths, the key mask, then the (B, Hq, S) float32 log-sum-exp, then the stage K
    and V or the shift's save K and V."""
    b, s, plen = c["batch"], c["sq"], c["present_len"]
    mask = b * plen if key_mask(c) else 0
    head = aligned(q_bytes) + aligned(8 * b) + mask
    lse = 0
    if has_sinks(c):
        lse = aligned(head)
        head = lse + 4 * b * c["hq"] * s
    if save_bytes(c):
        return aligned(head) + 2 * aligned(save_bytes(c)), lse, aligned(head)
    if not staged(c):
        return head, lse, 0
    return aligned(head) + 2 * aligned(stage_bytes(c)), lse, aligned(head)


def prepare_expected(c: dict, scratch: int, stage: int = 0, on_load: bool = False) -> dict:
    """Every argument of gqa_prepare for call c, given the scratch block's address (and the stage
    K's in it, for a staged windowed cache; present is the stage where no row can pass C); `on_load`:
    the attention rotates Q (rotary_on_load)."""
    b, s, hq, hkv, d = (c[k] for k in ("batch", "sq", "hq", "hkv", "d"))
    es = ES[c["dtype"]]
    rotary = c["rotary_dim"] > 0
    q_copy = (rotary or "q_norm_weight" in c) and not on_load  # Q rotated and/or normed into the scratch block
    first = s == c["total_sequence_length"]
    mask = key_mask(c)
    cap = c["present_len"] if windowed(c) else 0
    q_bytes = b * s * hq * d * es if q_copy else 0
    q_row = (hq + 2 * hkv) * d if c["packed"] else hq * d
    kv_row = q_row if c["packed"] else hkv * d
    q = c["query"]
    k = q + hq * d * es if c["packed"] else c["key"]
    v = q + (hq + hkv) * d * es if c["packed"] else c["value"]
    return dict(
        Q=q, K=k, V=v,
        PastK=c.get("past_key", 0), PastV=c.get("past_value", 0), PresentK=c["present_key"],
        PresentV=c["present_value"], QRot=scratch if q_copy else 0, Cos=c.get("cos_cache", 0), Sin=c.get("sin_cache", 0),
        StageK=c["present_key"] if in_place(c) else stage,
        StageV=c["present_value"] if in_place(c) else (stage + aligned(stage_bytes(c)) if stage else 0),
        PositionIds=c.get("position_ids", 0), Seqlens=c["seqlens_k"], Totals=scratch + aligned(q_bytes),
        KeyMask=scratch + aligned(q_bytes) + aligned(8 * b) if mask else 0,
        QNorm=c.get("q_norm_weight", 0), KNorm=c.get("k_norm_weight", 0),
        S=s, Hq=hq, Hkv=hkv, D=d, q_heads=hq if q_copy else 0,
        rotary=(2 if c["rotary_interleaved"] else 1) if rotary else 0,
        rotary_half=c["rotary_dim"] // 2, max_position=c["max_position"], has_position_ids=int("position_ids" in c),
        first_prompt=int(first), write_mask=int(mask), total_max=c["total_sequence_length"],
        present_len=c["present_len"], past_len=c["past_len"], qk_norm=int("q_norm_weight" in c),
        cap=cap, gap=cap - c["local_window_size"] + 1 if cap else 1, stage_len=cap + s if staged(c) else cap,
        shared=int(shared_cache(c)),
        qk_eps=f32(c.get("qk_norm_epsilon", 1e-6)), stride_qb=s * q_row, stride_qs=q_row,
        stride_kb=s * kv_row, stride_ks=kv_row, stride_vb=s * kv_row, stride_vs=kv_row, shift_phase=0,
        global_scratch=0, profile_scratch=0)


def attention_params(c: dict, want: dict) -> dict:
    """The FlashParams the attention must get (gqa_flash_params), as tests/test_launch_abi's params()
    (`want` the prepare kernel's arguments: QRot 0 where Q is not copied)."""
    b, s, hq, hkv, d, plen = (c[k] for k in ("batch", "sq", "hq", "hkv", "d", "present_len"))
    q_copy = bool(want["QRot"])
    q_row = hq * d if q_copy or not c["packed"] else (hq + 2 * hkv) * d
    k, v = c["present_key"], c["present_value"]
    if windowed(c):  # the attention reads the stage: C + S rows a (batch, KV head), or present's C
        k, v, plen = want["StageK"], want["StageV"], want["stage_len"]
    p = dict(dtype=c["dtype"], batch=b, hq=hq, hkv=hkv, sq=s, skv=plen, d=d, dv=d, q=want["QRot"] or want["Q"],
             q_stride=[s * q_row, d, q_row], k=k, v=v,
             k_stride=[hkv * plen * d, plen * d, d], v_stride=[hkv * plen * d, plen * d, d], y=c["output"],
             y_stride=[s * hq * d, d, hq * d], scale=1 / math.sqrt(d), causal=bool(c.get("causal", 1)), lse=0)
    if c.get("local_window_size", -1) > 0:
        p["window_left"] = c["local_window_size"] - 1
    if want["KeyMask"]:  # the key mask and the same counts as a key bound (the Gluon kernels')
        p.update(mask_kind="bool", mask=want["KeyMask"], mask_stride=[plen, 0, 0, 1], mask_len=plen,
                 key_bound=want["Totals"])
    elif causal_first(c):  # one row: a plain causal call over the prompt's S keys, no key bound
        p["skv"] = min(plen, c["total_sequence_length"])
    else:
        p["seqlens_k"] = want["Totals"]
    if c["rotary_dim"] and not q_copy:  # Q turned by the attention kernel as it loads Q
        p.update(rotary_cos=c["cos_cache"], rotary_sin=c["sin_cache"], rotary_half=c["rotary_dim"] // 2,
                 max_position=c["max_position"])
    return p


def launches(log: Log, i: int) -> list[tuple[dict, dict, dict]]:
    out = []
    for ev in log.calls[i]:
        if ev["ev"] == "launch":
            fn = log.functions[ev["function"]]
            e = log.entry_of_module[fn["module"]]
            got = decode_params(abi_names(e["kind"]), _fake_cuda.param_bytes(ev, fn))  # aot/contract.py's types
            out.append((ev, e, got))
    return out


CALLS = {
    "first prompt, packed, rotary, shared static cache, padded": gqa_call(),
    "decode, separate QKV, interleaved, position_ids, bf16": gqa_call(
        "bfloat16", b=3, s=1, total=100, past_len=4096, packed=False, interleaved=1, position_ids=True),
    "continuation into a separate present, no rotary, fp32": gqa_call(
        "float32", b=1, s=5, hq=4, hkv=1, d=64, total=25, past_len=20, shared=False, rotary_dim=0),
    "first prompt, separate present without past, causal=0, window": gqa_call(
        b=2, s=33, hq=6, hkv=3, d=80, total=33, past_len=0, shared=False, rotary_dim=32, causal=0,
        local_window_size=-1),
    "window of 0 keys": gqa_call(b=1, s=1, total=10, past_len=16, local_window_size=0),
    "windowed decode, softcap": gqa_call(b=2, s=1, total=50, past_len=64, local_window_size=8, softcap=30.0),
    "first prompt, Q/K norms, no rotary": gqa_call(rotary_dim=0, q_norm_weight=0xe000000, k_norm_weight=0xf000000,
                                                   qk_norm_epsilon=1e-5),
    "decode, Q/K norms and rotary, bf16": gqa_call("bfloat16", b=2, s=1, total=40, past_len=64,
                                                  q_norm_weight=0xe000000, k_norm_weight=0xf000000),
    # Attention sinks: the attention stores its log-sum-exp, the rescale kernel follows.
    "first prompt, head_sink, d80, padded": gqa_call(b=2, s=33, hq=6, hkv=3, d=80, total=33, past_len=40,
                                                    head_sink=0x10000000),
    "decode, smooth_softmax=1, separate QKV, bf16": gqa_call(
        "bfloat16", b=3, s=1, total=100, past_len=4096, packed=False, smooth_softmax=1),
    "continuation, head_sink and smooth_softmax, fp32 d256": gqa_call(
        "float32", b=1, s=19, hq=4, hkv=2, d=256, total=45, past_len=45, shared=False, rotary_dim=0,
        head_sink=0x10000000, smooth_softmax=1),
    "decode, head_sink, windowed, softcap, many heads": gqa_call(
        b=2, s=1, hq=40, hkv=8, d=64, total=300, past_len=512, head_sink=0x10000000, local_window_size=64,
        softcap=30.0),
    "window of 0 keys, smooth_softmax=1": gqa_call(b=1, s=1, total=10, past_len=16, local_window_size=0,
                                                  smooth_softmax=1),
    # A windowed cache (sliding_window_cache=1): the stage, the attention over it, the compaction.
    "windowed cache, decode, shared buffer": gqa_call(b=3, s=1, total=700, past_len=160, local_window_size=128,
                                                      sliding_window_cache=1),
    "windowed cache, first prompt, separate present, head_sink, bf16": gqa_call(
        "bfloat16", b=2, s=300, hq=8, hkv=2, d=64, total=300, past_len=256, shared=False, local_window_size=256,
        sliding_window_cache=1, head_sink=0x10000000),
    "windowed cache, chunked prefill, no rotary, fp32 d80": gqa_call(
        "float32", b=1, s=9, hq=4, hkv=1, d=80, total=70, past_len=64, packed=False, rotary_dim=0,
        local_window_size=33, sliding_window_cache=1),
    # A windowed cache no row can pass (total_sequence_length <= C): present is the stage, the new
    # tokens in place; a shared buffer needs no past copy and no compaction.
    "windowed cache within its capacity, decode, shared buffer": gqa_call(
        b=3, s=1, total=160, past_len=160, local_window_size=128, sliding_window_cache=1),
    "windowed cache one past its capacity, decode, shared buffer": gqa_call(
        b=3, s=1, total=161, past_len=160, local_window_size=128, sliding_window_cache=1),
    # Decode past the capacity: present is the stage, the kept rows moved down first (a shared
    # buffer: the shift; a present of its own: the past copy, then the compaction's zeros); a past
    # whose K is present's and whose V is not stays on the stage.
    "windowed cache past its capacity, decode, separate present, bf16 d64": gqa_call(
        "bfloat16", b=2, s=1, hq=8, hkv=2, d=64, total=5000, past_len=4096, shared=False, local_window_size=4096,
        sliding_window_cache=1),
    "windowed cache past its capacity, decode, shared buffer, head_sink, fp32 d256": gqa_call(
        "float32", b=2, s=1, hq=4, hkv=2, d=256, total=300, past_len=256, local_window_size=200,
        sliding_window_cache=1, head_sink=0x10000000),
    "windowed cache past its capacity, decode, past K shared, past V not": gqa_call(
        b=2, s=1, total=300, past_len=256, local_window_size=256, sliding_window_cache=1, past_value=0xd000000),
    "windowed cache within its capacity, decode, separate present, bf16": gqa_call(
        "bfloat16", b=2, s=1, total=100, past_len=128, shared=False, packed=False, local_window_size=128,
        sliding_window_cache=1),
    "windowed cache within its capacity, first prompt, separate present, head_sink": gqa_call(
        b=2, s=200, hq=8, hkv=2, d=64, total=200, past_len=256, shared=False, local_window_size=256,
        sliding_window_cache=1, head_sink=0x10000000),
    "windowed cache within its capacity, first prompt, shared buffer, d256": gqa_call(
        b=2, s=19, hq=4, hkv=2, d=256, total=19, past_len=32, local_window_size=8, sliding_window_cache=1),
    "windowed cache within its capacity, chunked prefill, fp32 d80": gqa_call(
        "float32", b=1, s=9, hq=4, hkv=1, d=80, total=60, past_len=64, rotary_dim=0, local_window_size=33,
        sliding_window_cache=1),
    # Causal first prompts: one row runs unmasked over its S keys, several keep the key mask.
    "first prompt, one row, separate present, fp32": gqa_call("float32", b=1, s=40, hq=4, hkv=4, d=64, total=40,
                                                               past_len=0, shared=False),
    "first prompt, one row into a longer buffer, head_sink, d256": gqa_call(
        "bfloat16", b=1, s=19, hq=4, hkv=2, d=256, total=19, past_len=96, head_sink=0x10000000),
    "first prompt, batch of 5, window, bf16 d256": gqa_call("bfloat16", b=5, s=19, hq=4, hkv=2, d=256, total=19,
                                                             past_len=32, local_window_size=6),
    # Several rows at d64 / d128 on sm_90: the unmasked Gluon kernels with the rows' key counts as
    # their key bound (BOUNDED), not the mask.
    "first prompt, batch of 3, d128, into a longer buffer": gqa_call(b=3, s=300, total=300, past_len=512),
    "first prompt, batch of 2, d64, bf16, 2100 tokens": gqa_call("bfloat16", b=2, s=2100, d=64, total=2100,
                                                                past_len=2304),
    # Rotary over the whole head: the Gluon kernels turn Q as they load it (ROTARY_ON_LOAD), the
    # prepare kernel writes K and V only; partial rotary (above) keeps the rotated copy of Q.
    "first prompt, batch of 3, d128, full rotary": gqa_call(b=3, s=300, total=300, past_len=512, rotary_dim=128),
    "first prompt, one row, d128, full rotary, separate present": gqa_call(b=1, s=200, total=200, past_len=0,
                                                                          shared=False, rotary_dim=128),
    "first prompt, batch of 2, d64, full rotary, head_sink": gqa_call(b=2, s=150, d=64, total=150, past_len=256,
                                                                     head_sink=0x10000000),
    "first prompt, full rotary, position_ids": gqa_call(b=2, s=300, total=300, past_len=512, rotary_dim=128,
                                                        position_ids=True),
    "first prompt, full rotary, cos_cache not 16-byte aligned": gqa_call(b=2, s=300, total=300, past_len=512,
                                                                        rotary_dim=128, cos_cache=0x9000008),
}
BOUNDED = {"first prompt, batch of 3, d128, into a longer buffer", "first prompt, batch of 2, d64, bf16, 2100 tokens",
           "first prompt, batch of 3, d128, full rotary", "first prompt, batch of 2, d64, full rotary, head_sink",
           "first prompt, full rotary, position_ids", "first prompt, full rotary, cos_cache not 16-byte aligned"}
ROTARY_ON_LOAD = {"first prompt, batch of 2, d64, bf16, 2100 tokens", "first prompt, batch of 3, d128, full rotary",
                  "first prompt, one row, d128, full rotary, separate present",
                  "first prompt, batch of 2, d64, full rotary, head_sink"}
REFUSED = {
    "chunked prefill at batch 2": (gqa_call(b=2, s=4, total=20), "needs batch 1"),
    "total_sequence_length below S": (gqa_call(b=1, s=9, total=8, past_len=0, shared=False), "less than the 9 new tokens"),
    "(token, head) rows past int32": (gqa_call(b=1, s=50_000_000, hq=32, hkv=8, total=50_000_000, past_len=0,
                                               shared=False), "rows of a batch row exceed int32"),
}


def run_calls(folder: Path, calls: list[dict], switches: dict) -> tuple[list, Log]:
    """`calls` run by the op's CUDA path in a child over the fake driver (built into `folder`), with
    the launcher's `switches` set: (each call's error or None, the driver's log)."""
    driver = _fake_cuda.build(folder / "fake_cuda")
    log_path = folder / "cuda.log"
    env = {"FAKE_CUDA_ARCH": str(ARCH), "FAKE_CUDA_SMS": str(SMS), **switches}
    out = _fake_cuda.run_python(driver, log_path, _CHILD, json.dumps({"calls": calls, "stream": STREAM}), env)
    events = [json.loads(line) for line in log_path.read_text().splitlines()]
    return json.loads(out.strip().splitlines()[-1]), Log(events)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_calls(tmp_path_factory.mktemp("gqa"), list(CALLS.values()) + [c for c, _ in REFUSED.values()], {})


def test_full_window_shift_at_every_batch(tmp_path):
    """A full-window decode step runs over present (the shift kernels) at every batch, with
    ORT_FLASH_WINDOW_SHIFT unset or 1; =0 runs it over a stage, then the compaction."""
    big = gqa_call(b=8, s=1, hq=16, hkv=8, total=161, past_len=160, local_window_size=128, sliding_window_cache=1)
    small = gqa_call(b=1, s=1, hq=4, hkv=1, total=161, past_len=160, local_window_size=128,
                     sliding_window_cache=1)  # one (batch row, KV head) pair
    runs = (({}, ["gqa_shift", "gqa_shift"]), ({"ORT_FLASH_WINDOW_SHIFT": "0"}, ["gqa_past", "gqa_past"]),
            ({"ORT_FLASH_WINDOW_SHIFT": "1"}, ["gqa_shift", "gqa_shift"]))
    for n, (switches, want) in enumerate(runs):
        errors, log = run_calls(tmp_path / str(n), [big, small], switches)
        assert errors == [None, None], switches
        firsts = [launches(log, i)[0][1]["kind"] for i in range(2)]
        assert firsts == want, (switches, firsts)
        for i in range(2):
            kinds = [e["kind"] for _, e, _ in launches(log, i)]
            assert ("gqa_compact" in kinds) == (firsts[i] == "gqa_past"), (switches, i, kinds)


def test_full_window_staged_with_the_switch_off(tmp_path):
    """With ORT_FLASH_WINDOW_SHIFT=0 a decode step past a window-sized cache's capacity runs over a
    stage of its own: the past copy into the scratch block, no shift, the compaction after."""
    names = [w for w, c in CALLS.items() if windowed(c) and c["sq"] == 1 and c["total_sequence_length"] > c["present_len"]]
    calls = [CALLS[w] for w in names]
    assert len(calls) >= 3
    errors, log = run_calls(tmp_path, calls, {"ORT_FLASH_WINDOW_SHIFT": "0"})
    assert errors == [None] * len(calls)
    for i, (what, c) in enumerate(zip(names, calls)):
        got = launches(log, i)
        kinds = [e["kind"] for _, e, _ in got]
        stage = [a["StageK"] for _, e, a in got if e["kind"] == "gqa_past"]
        assert "gqa_shift" not in kinds and kinds[0] == "gqa_past" and "gqa_compact" in kinds, (what, kinds)
        assert stage and stage[0] != c["present_key"], what  # the scratch block's stage, not present


def test_rotary_copy_with_the_switch_off(tmp_path):
    """With ORT_FLASH_ROTARY_ON_LOAD=0 the calls that would take Q's rotary on load rotate Q into
    the scratch block's copy (every Q head a prepare row) and the attention gets no rotary."""
    calls = [CALLS[w] for w in sorted(ROTARY_ON_LOAD)]
    errors, log = run_calls(tmp_path, calls, {"ORT_FLASH_ROTARY_ON_LOAD": "0"})
    assert errors == [None] * len(calls)
    for i, c in enumerate(calls):
        got = launches(log, i)
        prepare = [a for _, e, a in got if e["kind"] == "gqa_prepare"]
        attention = [a for _, e, a in got if e["kind"] in ("fwd", "fwd_tma", "fwd_gluon")]
        assert prepare and prepare[0]["q_heads"] == c["hq"] and prepare[0]["QRot"] != 0, sorted(ROTARY_ON_LOAD)[i]
        assert attention and attention[0].get("rotary_half", 0) == 0, sorted(ROTARY_ON_LOAD)[i]


@pytest.mark.parametrize("what", list(CALLS))
def test_gqa_launches(runs, what):
    errors, log = runs
    i = list(CALLS).index(what)
    c = CALLS[what]
    assert errors[i] is None, errors[i]
    allocs = [e for e in log.calls[i] if e["ev"] == "alloc"]
    scratch = allocs[0]
    got = launches(log, i)
    kinds = [e["kind"] for _, e, _ in got if e["kind"] in ("fwd", "fwd_tma", "fwd_gluon", "decode")]
    on_load = bool(kinds) and rotary_on_load(c, kinds[0])
    assert on_load == (what in ROTARY_ON_LOAD and ARCH == 90), f"{what}: Q's rotary on load is {on_load}"
    b, s, hkv, es = c["batch"], c["sq"], c["hkv"], ES[c["dtype"]]
    q_bytes = b * s * c["hq"] * c["d"] * es if (c["rotary_dim"] or "q_norm_weight" in c) and not on_load else 0
    scratch_bytes, lse_offset, stage_offset = scratch_layout(c, q_bytes)
    want = prepare_expected(c, scratch["ptr"], scratch["ptr"] + stage_offset if staged(c) else 0, on_load)
    assert scratch["stream"] == STREAM and scratch["bytes"] == scratch_bytes
    shared = shared_cache(c)
    copies = not shared or staged(c)  # a stage of its own takes each row's resident rows in any case
    shifts = full_window(c) and shared  # the kept rows moved down in place
    prepares = got[:2 if copies else 3 if shifts else 1]
    if copies:  # the past copy first: rows of present_len, one (batch, KV head) per grid row
        ev, e, args = prepares[0]
        assert e["variant"] == f"gqa_past_{SHORT[c['dtype']]}_d{block_d(c['d'])}" and args == want
        assert ev["grid"] == [math.ceil(c["present_len"] / e["block_m"]), b * hkv, 1]
        assert e["block_m"] * block_d(c["d"]) == 2048
    elif shifts:  # the shift first, its save then its move: a program per block of a (batch, KV head)
        save = scratch["ptr"] + stage_offset
        for phase, (ev, e, args) in enumerate(prepares[:2]):
            assert e["variant"] == f"gqa_shift_{SHORT[c['dtype']]}_d{block_d(c['d'])}", what
            assert args == dict(want, StageK=save, StageV=save + aligned(save_bytes(c)), shift_phase=phase), what
            assert ev["grid"] == [math.ceil(c["present_len"] / e["block_m"]), b * hkv, 1]
            assert e["block_m"] == shift_rows(c)
    assert not [r for r in got[len(prepares):] if r[1]["kind"] in ("gqa_past", "gqa_shift")], what
    ev, e, args = prepares[-1]
    # the smallest BLOCK_D holding the head size; block_m rows of one batch row per program, a
    # row being a (token, head) pair: the rotated Q heads, the K heads and the V heads of a token
    assert e["variant"] == f"gqa_prepare_{SHORT[c['dtype']]}_d{block_d(c['d'])}" and args == want
    assert e["block_m"] * block_d(c["d"]) == 4096
    assert ev["grid"] == [b * math.ceil(s * (want["q_heads"] + 2 * hkv) / e["block_m"]), 1, 1]
    for ev, e, _ in prepares:
        assert ev["block"] == [32 * e["num_warps"], 1, 1] and ev["shared"] == e["shared"] and ev["stream"] == STREAM
    rest = got[len(prepares):]
    # The compaction into present right after the attention, before a rescale: from the stage, or
    # where present is the stage, in a present of its own (zeros after each row's T_b rows).
    if staged(c) or (in_place(c) and not shared):
        compact = [r for r in rest if r[1]["kind"] == "gqa_compact"]
        assert len(compact) == 1, f"{what}: one compaction"
        at = rest.index(compact[0])
        assert all(r[1]["kind"] in ("fwd", "fwd_tma", "fwd_gluon", "decode", "combine") for r in rest[:at]), what
        assert all(r[1]["kind"] == "sink_rescale" for r in rest[at + 1:]), what
        ev, e, args = compact[0]
        assert e["variant"] == f"gqa_compact_{SHORT[c['dtype']]}_d{block_d(c['d'])}" and args == want
        assert e["block_m"] * block_d(c["d"]) == 2048
        assert ev["grid"] == [math.ceil(c["present_len"] / e["block_m"]), b * hkv, 1]
        assert ev["block"] == [32 * e["num_warps"], 1, 1] and ev["shared"] == e["shared"] and ev["stream"] == STREAM
        rest = rest[:at] + rest[at + 1:]
    else:
        assert not [r for r in rest if r[1]["kind"] == "gqa_compact"], f"{what}: a compaction with nothing to move"
    if c.get("local_window_size", -1) == 0:  # no attention: the output zeroed on the stream
        assert not rest
        memset, = [e for e in log.calls[i] if e["ev"] == "memset"]
        out_bytes = b * s * c["hq"] * c["d"] * es
        assert memset == dict(ev="memset", dst=c["output"], value=0, bytes=out_bytes, stream=STREAM)
        return
    p = attention_params(c, want)
    if c.get("softcap"):
        p["softcap"] = c["softcap"]
    lse = scratch["ptr"] + lse_offset if has_sinks(c) else 0
    p["lse"] = lse
    rescale = [r for r in rest if r[1]["kind"] == "sink_rescale"]
    attention = [r for r in rest if r[1]["kind"] != "sink_rescale"]
    assert attention and all(r[1]["kind"] in ("fwd", "fwd_tma", "fwd_gluon", "decode", "combine") for r in attention)
    assert attention[0][1]["kind"] != "combine"
    ev, e, args = attention[0]
    assert ev["stream"] == STREAM
    bounded = bool(want["KeyMask"]) and e["kind"] == "fwd_gluon" and e["mask"] == "none"
    assert bounded == (what in BOUNDED and ARCH == 90), f"{what}: ran {e['variant']}"
    expected = _fwd_expected(p, dict(e, persistent=0, dynamic=False, kind="fwd"), 0, bounded)
    for name in ("Q", "K", "V", "Lse", "Mask", "SeqlensK", "has_seqlens", "mask_len", "Sq", "Skv", "causal",
                 "offset", "window_left", "store_lse", "stride_qb", "stride_qh", "stride_qm", "stride_kb",
                 "stride_kh", "stride_kn", "stride_mb", "stride_mh", "stride_mm", "scale", "softcap",
                 "Cos", "Sin", "rotary_half", "max_position"):
        if name in args:
            assert args[name] == expected[name], f"{what}: attention parameter {name}"
    for t in "QKVY":  # pointers, or the TMA descriptors' addresses
        ptr = args[t] if t in args else log.encodes[args[f"{t}.map"][1]]["address"]
        assert ptr == p[t.lower()], f"{what}: attention tensor {t}"
    assert f32(args["scale"]) == f32(1 / math.sqrt(c["d"]))
    for _, e, args in attention[1:]:  # a split-KV decode's merge writes the output and the log-sum-exp
        assert e["kind"] == "combine" and args["Lse"] == lse and args["store_lse"] == int(bool(lse)), what
    if not has_sinks(c):
        assert not rescale, f"{what}: a sink rescale without sinks"
        return
    # The rescale last, after every attention launch, on the same stream: y *= sigmoid(lse - sink)
    # over the output (B, S, Hq, D) in place, one program per block_m rows of one (batch, head).
    assert rest[-1] == rescale[0] and len(rescale) == 1, f"{what}: the rescale must follow the attention"
    ev, e, args = rescale[0]
    hq, d = c["hq"], c["d"]
    assert e["variant"] == f"sink_rescale_{SHORT[c['dtype']]}_d{block_d(d)}"
    assert e["block_m"] * block_d(d) == 2048
    assert args == dict(Y=c["output"], Lse=lse, Sinks=c.get("head_sink", 0), has_sinks=int("head_sink" in c),
                        Hq=hq, Sq=s, D=d, stride_yb=s * hq * d, stride_yh=d, stride_ym=hq * d,
                        global_scratch=0, profile_scratch=0), what
    assert ev["grid"] == [b * hq * math.ceil(s / e["block_m"]), 1, 1]
    assert ev["block"] == [32 * e["num_warps"], 1, 1] and ev["shared"] == e["shared"] and ev["stream"] == STREAM


def test_windowed_cache_decode_runs_in_place(runs):
    """A windowed cache's decode step into a shared buffer at total_sequence_length = C: the new
    token in place, the attention over present, no past copy, no stage, no compaction; one token
    later (C + 1), when a row may pass C, the same after the shift; a chunked prefill past C, the
    staged path."""
    errors, log = runs

    def run(what):
        i = list(CALLS).index(what)
        assert errors[i] is None, errors[i]
        return [(e["kind"], args) for _, e, args in launches(log, i)], CALLS[what]

    inside, c = run("windowed cache within its capacity, decode, shared buffer")
    assert inside[0][0] == "gqa_prepare" and not {"gqa_past", "gqa_compact"} & {k for k, _ in inside}
    assert inside[0][1]["StageK"] == c["present_key"] and inside[0][1]["stage_len"] == c["present_len"]
    attention = inside[1][1]  # K as a pointer, or a TMA descriptor's address
    k = attention["K"] if "K" in attention else log.encodes[attention["K.map"][1]]["address"]
    assert k == c["present_key"]
    past, c = run("windowed cache one past its capacity, decode, shared buffer")
    assert [k for k, _ in past[:3]] == ["gqa_shift", "gqa_shift", "gqa_prepare"]
    assert "gqa_compact" not in {k for k, _ in past}
    assert past[2][1]["StageK"] == c["present_key"] and past[2][1]["stage_len"] == c["present_len"]
    prefill, c = run("windowed cache, chunked prefill, no rotary, fp32 d80")
    assert [k for k, _ in prefill[:2]] == ["gqa_past", "gqa_prepare"] and prefill[-1][0] == "gqa_compact"
    assert prefill[1][1]["stage_len"] == c["present_len"] + c["sq"]


@pytest.mark.parametrize("what", list(REFUSED))
def test_gqa_refusals(runs, what):
    errors, log = runs
    i = len(CALLS) + list(REFUSED).index(what)
    assert errors[i] is not None and REFUSED[what][1] in errors[i], errors[i]
    assert not [e for e in log.calls[i] if e["ev"] in ("launch", "alloc")]


def test_gqa_kernels_load_with_the_table(runs):
    """The op's CUDA kernel creation (gqa_cuda_ready for each dtype, for a node with attention
    sinks and a windowed cache, run first by the child) found the four prepare kinds and the sink
    rescale for every dtype, loaded with the rest of the device's table."""
    _, log = runs
    loaded = {e["variant"] for e in log.entry_of_module.values()}
    assert {f"{k}_{t}_d{hd}" for k in ("gqa_prepare", "gqa_past", "gqa_compact", "gqa_shift", "sink_rescale")
            for t in ("fp16", "bf16", "fp32")
            for hd in (64, 128, 256)} <= loaded
