"""A stand-in for aot/flash_fwd_gluon.py in CPU tests, never shipped: a Gluon kernel with the real
one's interface (the FwdGluon ABI's runtime parameters, Q/K/V/Y as 4-D TMA descriptors with (1, 1, rows,
D) boxes, the BLOCK_M/BLOCK_N/BLOCK_D/NUM_STAGES constexprs, desc_signature; and get_gluon_config,
the tiles a test puts in place of aot/tiles.py's gluon_config) that only moves tiles (Y = Q after touching K and V), so
the AOT pipeline (signature strings, metadata, boxes, table rows) can be checked without the
kernel and without a GPU. It computes no attention: never launch it."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma


def desc_layout(dtype: str, rows: int, d: int):
    ty = {"fp16": gl.float16, "bf16": gl.bfloat16}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], ty)


def desc_signature(dtype: str, rows: int, d: int) -> str:
    return f"tensordesc<{dtype}{[1, 1, rows, d]},{desc_layout(dtype, rows, d)!r}>"


def get_gluon_config(dtype: str, d: int, causal: bool) -> dict:
    """A tile per head dim, and causal d64 apart (so the table splits by causal flag)."""
    return dict(BLOCK_M=128, BLOCK_N=64 if d == 128 or causal else 128, NUM_STAGES=2, num_warps=4)


@gluon.jit
def _load(Q, K, V, q_s, k_s, v_s, bar, b, h, hk, row):
    mbarrier.expect(bar, Q.block_type.nbytes + K.block_type.nbytes + V.block_type.nbytes)
    tma.async_copy_global_to_shared(Q, [b, h, row, 0], bar, q_s)
    tma.async_copy_global_to_shared(K, [b, hk, 0, 0], bar, k_s)
    tma.async_copy_global_to_shared(V, [b, hk, 0, 0], bar, v_s)


@gluon.jit
def _store(Y, q_s, bar, b, h, row):
    mbarrier.wait(bar, phase=0)
    fence_async_shared()
    tma.async_copy_shared_to_global(Y, [b, h, row, 0], q_s)
    tma.store_wait(pendings=0)


@gluon.jit
def flash_fwd_gluon(
    Q, K, V, Y, Lse, Mask, SeqlensK,
    scale, softcap,
    Hq, group, Sq, Skv, D, Dv, offset, causal, window_left, window_right, mask_len, has_seqlens,
    store_lse,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_yb, stride_yh, stride_ym,
    stride_mb, stride_mh, stride_mm,
    TileCounter, Cos, Sin, rotary_half, max_position,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    # Warp-specialized like the real kernel (a 1-warp TMA producer), so the metadata's num_warps
    # is the launch's total.
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group
    q_s = gl.allocate_shared_memory(Q.dtype, Q.block_type.shape, Q.layout)
    k_s = gl.allocate_shared_memory(K.dtype, K.block_type.shape, K.layout)
    v_s = gl.allocate_shared_memory(V.dtype, V.block_type.shape, V.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    row = pid_m * BLOCK_M
    gl.warp_specialize([(_store, (Y, q_s, bar, b, h, row)),
                        (_load, (Q, K, V, q_s, k_s, v_s, bar, b, h, hk, row))], [1], [24])
    mbarrier.invalidate(bar)
