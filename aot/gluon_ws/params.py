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
