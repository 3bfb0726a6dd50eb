"""The warp-specialized kernel's tile orders on a persistent grid (aot/flash_fwd_gluon_ws.py), mirrored
for the CPU tests (test_gluon_aot, test_ws_protocol), which check these lines against the kernel's
source: each maps a tile id of the call to its (batch x head, query tile)."""


def cta_tile(tid: int, n_m: int, bh_all: int, causal: bool) -> tuple[int, int]:
    """_cta_tile under PERSISTENT: a head's tiles together, or under causal every head's longest
    tile first, then the next."""
    if causal:
        return tid % bh_all, n_m - 1 - tid // bh_all
    return tid // n_m, n_m - 1 - tid % n_m


def tile_of(tid: int, n_m: int, bh_all: int, grp: int) -> tuple[int, int]:
    """_tile_of (DYNAMIC_TILES): heads in groups of grp, each group's longest tiles first."""
    per = grp * n_m
    g = tid // per
    gsz = min(grp, bh_all - g * grp)
    i = tid - g * per
    return g * grp + i % gsz, n_m - 1 - i // gsz
