"""The consumers' online softmax per key block: the one-partition kernel's _softmax (a causal or
ragged bound per element), _softmax_lim (both bounds folded into one per row, where several tiles
per CTA add registers of their own) and, under a key-vector mask, _softmax_bias over the mask
values _key_mask loads a block ahead."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..flash_fwd_gluon import LOG2E, _softmax  # noqa: F401 (_softmax: the main loop's unmasked step)


@gluon.jit
def _softmax_lim(s, m_i, l_i, start_n, mask_from, lim, qk_scale,
                 s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """_softmax with the two masks folded into one bound per row (key j kept iff j <= lim =
    min(pos, hi - 1)): one compare an element, fewer registers where the loop over tiles adds its own."""
    if start_n + BLOCK_N > mask_from:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= lim[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2 gives 0
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _key_mask(m_base, start_n, hi, s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """The raw mask values of keys [start_n, start_n + BLOCK_N), laid out as S's columns (0 past
    hi: those keys are hidden by the softmax's bound). Loaded a block ahead of their use, so that
    the load's latency hides under a whole iteration rather than under one wgmma."""
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return gl.load(m_base + cols, mask=cols < hi, other=0)


@gluon.jit
def _softmax_bias(s, mv, m_i, l_i, start_n, mask_from, lim, qk_scale,
                  s_layout: gl.constexpr, BLOCK_N: gl.constexpr, MASK_KIND: gl.constexpr):
    """_softmax_lim under a key-vector mask: the mask as one log2-unit bias per key (bool 0 /
    -inf; additive mask * log2(e), clamped at -1e38 so that a dtype's lowest does not overflow to
    -inf), added to the scaled scores, which are rounded before the running max is subtracted:
    a row whose every key sits at the same huge bias then gets exactly equal weights, as in the
    reference (an fma of the unrounded product would leave rounding noise of the bias's size)."""
    if MASK_KIND == 2:
        mf = mv.to(gl.float32)
        bias = gl.where(mf == float("-inf"), float("-inf"), gl.maximum(mf, -1.0e38) * LOG2E)
    else:
        bias = gl.where(mv != 0, 0.0, float("-inf"))
    s = s * qk_scale + bias[None, :]
    if start_n + BLOCK_N > mask_from:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= lim[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i
