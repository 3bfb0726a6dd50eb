"""The warp-specialized kernel's fixed launch parameters: its partitions' warps and registers, read
from aot/tiles.py (the variant table reads the same numbers)."""
from triton.experimental.gluon import language as gl

from ..tiles import WS_CONSUMER_WARPS, WS_PRODUCER_REGS

CONSUMER_WARPS = gl.constexpr(WS_CONSUMER_WARPS)  # the default partition: one consumer warpgroup
PRODUCER_REGS = gl.constexpr(WS_PRODUCER_REGS)
