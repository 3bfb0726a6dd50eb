"""The warp-specialized kernel's epilogue: a consumer's normalized output rows and log-sum-exps."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ..flash_fwd_gluon import LN2


@gluon.jit
def _epilogue(Y, Lse, bufs, call, tile, q_slot, q_idx, state, r0, rows, o_layout: gl.constexpr, QB: gl.constexpr):
    """A consumer's rows of a tile out: O / l into its Q slot, from there to Y by TMA (clipped past
    Sq), the log-sum-exp (natural log; -inf and O = 0 for a row that saw no key) where asked; with
    two Q buffers the slot is freed for a later tile's Q once the store has read it. bufs, call,
    tile and state (the accumulator and the running max and sum) are params.py's structs."""
    acc = state.acc
    m_i = state.m_i
    l_i = state.l_i
    b = tile.b
    h = tile.h
    pid_bh = tile.pid_bh
    Sq = call.Sq
    store_lse = call.store_lse
    q_empty = bufs.q_empty
    q = q_slot.reshape([q_slot.shape[2], q_slot.shape[3]])
    dtype: gl.constexpr = q_slot.dtype
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    q.store(out.to(dtype))  # this consumer's Q slot holds its output rows; TMA clips past Sq
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(Y, [b, h, r0, 0], q_slot)
    if store_lse != 0:
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
        gl.store(Lse + pid_bh.to(gl.int64) * Sq + rows, lse, mask=rows < Sq)
    tma.store_wait(0)
    if QB > 1:  # the store has read the slot: the producer may load a later tile's Q there
        mbarrier.arrive(q_empty.index(q_idx))
