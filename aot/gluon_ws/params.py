"""The warp-specialized kernel's fixed launch parameters (its partitions' warps and registers, read
from aot/tiles.py: the variant table reads the same numbers) and the structs its partitions take."""
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.language.core import _aggregate as aggregate

from ..tiles import WS_CONSUMER_WARPS, WS_PRODUCER_REGS

CONSUMER_WARPS = gl.constexpr(WS_CONSUMER_WARPS)  # the default partition: one consumer warpgroup
PRODUCER_REGS = gl.constexpr(WS_PRODUCER_REGS)


@aggregate
class Buffers:
    """The CTA's shared memory as the consumers see it: the Q buffers, the K/V ring, their `ready`
    and `empty` barriers, and the consumers' turns (one mbarrier each). Its fields flatten in this
    order, the order the partitions' arguments had before they were a struct."""
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
