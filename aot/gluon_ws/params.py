"""The warp-specialized kernel's fixed launch parameters (its partitions' warps and registers, read
from aot/tiles.py: the variant table reads the same numbers) and the structs its partitions take."""
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.language.core import _aggregate as aggregate
from triton.language.core import base_value

from ..tiles import WS_CONSUMER_WARPS, WS_PRODUCER_REGS

CONSUMER_WARPS = gl.constexpr(WS_CONSUMER_WARPS)  # the default partition: one consumer warpgroup
PRODUCER_REGS = gl.constexpr(WS_PRODUCER_REGS)


@aggregate
class Buffers:
    """The CTA's shared memory as the consumers see it: the Q buffers, the K/V ring, their `ready`
    and `empty` barriers, and the consumers' turns (one mbarrier each). Its fields flatten in this
    order, the kernel's capture order for them, which the machine code follows."""
    q_smem: gl.shared_memory_descriptor
    k_ring: gl.shared_memory_descriptor
    v_ring: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    q_empty: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    k_empty: gl.shared_memory_descriptor
    v_empty: gl.shared_memory_descriptor
    turns: gl.shared_memory_descriptor

    @constexpr_function
    def __init__(self, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns):
        self.q_smem = q_smem
        self.k_ring = k_ring
        self.v_ring = v_ring
        self.q_ready = q_ready
        self.q_empty = q_empty
        self.k_ready = k_ready
        self.v_ready = v_ready
        self.k_empty = k_empty
        self.v_empty = v_empty
        self.turns = turns


@aggregate
class ConsumerConfig:
    """A consumer's compile-time configuration (constexprs only: nothing of it reaches the IR as a
    value): rows per consumer, key block, head dim, ring depth, the turns, consumers per CTA,
    tiles per CTA, the key-vector mask kind and the kernel's options."""
    WG_M: gl.constexpr
    BLOCK_N: gl.constexpr
    BLOCK_D: gl.constexpr
    NUM_STAGES: gl.constexpr
    PINGPONG: gl.constexpr
    NC: gl.constexpr
    TILES: gl.constexpr
    MASK_KIND: gl.constexpr
    OVERLAP: gl.constexpr
    PREFIX: gl.constexpr
    PERSISTENT: gl.constexpr
    DYNAMIC: gl.constexpr
    SKIP: gl.constexpr

    @constexpr_function
    def __init__(self, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, TILES, MASK_KIND, OVERLAP, PREFIX,
                 PERSISTENT, DYNAMIC, SKIP):
        self.WG_M = gl.constexpr(WG_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.BLOCK_D = gl.constexpr(BLOCK_D)
        self.NUM_STAGES = gl.constexpr(NUM_STAGES)
        self.PINGPONG = gl.constexpr(PINGPONG)
        self.NC = gl.constexpr(NC)
        self.TILES = gl.constexpr(TILES)
        self.MASK_KIND = gl.constexpr(MASK_KIND)
        self.OVERLAP = gl.constexpr(OVERLAP)
        self.PREFIX = gl.constexpr(PREFIX)
        self.PERSISTENT = gl.constexpr(PERSISTENT)
        self.DYNAMIC = gl.constexpr(DYNAMIC)
        self.SKIP = gl.constexpr(SKIP)


@constexpr_function
def _value(x):
    """A field's value: a Gluon value as it is, a Python constant as a constexpr."""
    return x if isinstance(x, base_value) else gl.constexpr(x)


@aggregate
class Work:
    """The scalars every partition reads, then the producer's own, in the kernel's capture order
    (their flattened order, which the machine code follows: keep it). The CTA's (batch, head) and
    (batch, head) index, its first tile's rows; the query and key lengths, the queries' offset among
    the keys, causal; the tile's key blocks and key bound; the softmax scale (log2 units) and
    whether the log-sum-exp is stored; the span of tiles the scheduler gives the CTA (g0, n_valid of
    bh_all (batch, head) pairs) and the heads per batch; the key-vector mask row, the visible range
    the first consumer publishes for the producer (lim_smem, lim_bar), the dynamic tiles' ids and
    head grouping; then the KV head, the query heads per KV head, the dynamic tiles' counter
    (ctr, use_ctr) and the per-row key bound (seqlens, has_seqlens: scheduler.py _tile_keys)."""
    b: base_value
    h: base_value
    pid_bh: base_value
    m0: base_value
    Sq: base_value
    Skv: base_value
    offset: base_value
    causal: base_value
    n_blocks: base_value
    hi: base_value
    qk_scale: base_value
    store_lse: base_value
    g0: base_value
    n_valid: base_value
    bh_all: base_value
    Hq: base_value
    m_base: base_value
    lim_smem: base_value
    lim_bar: base_value
    ids: base_value
    grp: base_value
    hk: base_value
    group: base_value
    ctr: base_value
    use_ctr: base_value
    seqlens: base_value
    has_seqlens: base_value

    @constexpr_function
    def __init__(self, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                 g0, n_valid, bh_all, Hq, m_base, lim_smem, lim_bar, ids, grp, hk, group, ctr,
                 use_ctr, seqlens, has_seqlens):
        self.b = _value(b)
        self.h = _value(h)
        self.pid_bh = _value(pid_bh)
        self.m0 = _value(m0)
        self.Sq = _value(Sq)
        self.Skv = _value(Skv)
        self.offset = _value(offset)
        self.causal = _value(causal)
        self.n_blocks = _value(n_blocks)
        self.hi = _value(hi)
        self.qk_scale = _value(qk_scale)
        self.store_lse = _value(store_lse)
        self.g0 = _value(g0)
        self.n_valid = _value(n_valid)
        self.bh_all = _value(bh_all)
        self.Hq = _value(Hq)
        self.m_base = _value(m_base)
        self.lim_smem = _value(lim_smem)
        self.lim_bar = _value(lim_bar)
        self.ids = _value(ids)
        self.grp = _value(grp)
        self.hk = _value(hk)
        self.group = _value(group)
        self.ctr = _value(ctr)
        self.use_ctr = _value(use_ctr)
        self.seqlens = _value(seqlens)
        self.has_seqlens = _value(has_seqlens)


@aggregate
class Rope:
    """Q's rotary as the consumers apply it to their Q rows (flash_fwd_gluon._rotate_rows; contract.py's
    FwdGluon ABI): the cos and sin tables, half the rotated dims (0: none) and the tables' rows."""
    Cos: base_value
    Sin: base_value
    half: base_value
    max_position: base_value

    @constexpr_function
    def __init__(self, Cos, Sin, half, max_position):
        self.Cos = _value(Cos)
        self.Sin = _value(Sin)
        self.half = _value(half)
        self.max_position = _value(max_position)


@aggregate
class Call:
    """One consumer tile's view of the call: query and key lengths (the key length may be a
    visible run's), the queries' offset among the keys, causal, the softmax scale (log2 units),
    whether the log-sum-exp is stored, and the key-vector mask row."""
    Sq: base_value
    Skv: base_value
    offset: base_value
    causal: base_value
    qk_scale: base_value
    store_lse: base_value
    m_base: base_value

    @constexpr_function
    def __init__(self, Sq, Skv, offset, causal, qk_scale, store_lse, m_base):
        self.Sq = _value(Sq)
        self.Skv = _value(Skv)
        self.offset = _value(offset)
        self.causal = _value(causal)
        self.qk_scale = _value(qk_scale)
        self.store_lse = _value(store_lse)
        self.m_base = _value(m_base)


@aggregate
class Tile:
    """One query tile of a consumer: its (batch, head), (batch, head) index and first row, its
    key blocks and key bound, and the running counts it starts from (its Q buffer t, ring block
    c0, turn i0)."""
    b: base_value
    h: base_value
    pid_bh: base_value
    m0: base_value
    n_blocks: base_value
    hi: base_value
    t: base_value
    c0: base_value
    i0: base_value

    @constexpr_function
    def __init__(self, b, h, pid_bh, m0, n_blocks, hi, t, c0, i0):
        self.b = _value(b)
        self.h = _value(h)
        self.pid_bh = _value(pid_bh)
        self.m0 = _value(m0)
        self.n_blocks = _value(n_blocks)
        self.hi = _value(hi)
        self.t = _value(t)
        self.c0 = _value(c0)
        self.i0 = _value(i0)


@aggregate
class Acc:
    """A consumer tile's running result: the unnormalized output (fp32 accumulator) and each row's
    running max and sum of the softmax."""
    acc: base_value
    m_i: base_value
    l_i: base_value

    @constexpr_function
    def __init__(self, acc, m_i, l_i):
        self.acc = _value(acc)
        self.m_i = _value(m_i)
        self.l_i = _value(l_i)
