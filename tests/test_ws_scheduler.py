"""The warp-specialized kernel's tiles against the launcher's grids, checked without a GPU: the
kernel's own entry point and producer (aot/flash_fwd_gluon_ws.py, aot/gluon_ws/) run on the host
(tests/_gluon_host.py) for every CTA of the grid the C++ planner gives (ort_flash._C.fwd_grid,
cpp/launch_plan.cc), with the arguments the launcher passes by name (aot/contract.py's FwdGluon
ABI: Q's descriptor with its (B, Hq, Sq, D) dims, which a persistent grid reads B x Hq from, the
tile counter pair in TileCounter for dynamic tiles, no window). Every (batch, head, query
tile) of a call is loaded exactly once, with the key blocks its rows see, for a CTA per tile, two
tiles per CTA, the persistent grid and dynamic tiles (their CTAs' claims interleaved at random);
the dynamic counter ends at zero for the next launch on the stream."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel's source imports Gluon")
_C = pytest.importorskip("ort_flash._C", reason="the native module is not built")

from _gluon_host import Desc, HostGl, HInt, Inert, Interleaving, Ptr, host  # noqa: E402

from aot import contract  # noqa: E402
from aot import flash_fwd_gluon_ws as entry  # noqa: E402
from aot import tiles  # noqa: E402
from aot.gluon_ws import scheduler  # noqa: E402

SMS = 132


def _params(b, hq, sq, skv, causal, offset=0):
    p = _C.FlashParams()
    p.dtype = _C.DType.float16
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hq, sq, skv, 128, 128
    p.causal, p.offset, p.window_right = causal, offset, -1
    return p


def _ctas(*, b, hq, sq, skv, causal, head_dim, tiles_per_cta=1, persistent=False, dynamic=False,
          offset=0, seed=0):
    """[(CTA, [(b, h, query tile, key blocks), ...] in load order)], the dynamic counter pair after
    the launch, and the grid (x, y, the call's query tiles): each CTA of the launcher's grid
    through the kernel's entry and producer on the host, its loads stubbed to record what they
    load."""
    cfg = tiles.ws_config("fp16", head_dim, causal)
    block_m, nc = cfg["BLOCK_M"], cfg["NUM_CONSUMERS"]
    entry_block_m = block_m * tiles_per_cta  # the table's block_m: all of a CTA's tiles
    x, y, n_tiles = _C.fwd_grid(_params(b, hq, sq, skv, causal, offset), entry_block_m, int(persistent), SMS)
    counter = [0, 0]
    loads = {}
    interleaving = Interleaving(random.Random(seed))

    def cta(gx, gy):
        mine = loads.setdefault((gx, gy), [])

        def producer_tile(*a):  # _producer_tile(Q, K, V, bufs, b, h, hk, m0, n_blocks, t, c0, cfg)
            b_t, h_t, _, m0, n_blocks = a[4:9]
            assert m0 % block_m == 0
            mine.append((int(b_t), int(h_t), int(m0) // block_m, int(n_blocks)))

        gl = HostGl((x, y, 1), (gx, gy, 0), point=interleaving.point if dynamic else None, partitions=(nc,))
        kernel = host(entry.flash_fwd_gluon_ws, gl, _producer_tile=producer_tile, _publish_tile=lambda *a: None,
                      mbarrier=Inert(), fence_async_shared=Inert())
        i = HInt
        args = dict(Q=Desc("Q", 0, (b, hq, sq, head_dim)), K=Inert(), V=Inert(), Y=Inert(), Lse=Inert(),
                    Mask=Inert(), SeqlensK=Inert(), scale=Inert(), softcap=Inert(), Hq=i(hq), group=i(1), Sq=i(sq),
                    Skv=i(skv), D=i(head_dim), Dv=i(head_dim), offset=i(offset), causal=i(int(causal)),
                    window_left=i(-1), window_right=i(-1), mask_len=i(skv), has_seqlens=i(0), store_lse=i(1),
                    TileCounter=Ptr(counter if dynamic else None), Cos=Inert(), Sin=Inert(), rotary_half=i(0),
                    max_position=i(0),
                    **{n: i(0) for n in contract.runtime_args("fwd_gluon") if n.startswith("stride_")})
        kernel(*contract.ordered_args("fwd_gluon", args), block_m, cfg["BLOCK_N"], head_dim, cfg["NUM_STAGES"], True,
               nc, cfg["CONSUMER_REGS"], tiles_per_cta, 0, False, False, persistent, dynamic, False)

    if dynamic:
        interleaving.run([lambda gx=gx: cta(gx, 0) for gx in range(x)])
    else:
        for gx in range(x):
            for gy in range(y):
                cta(gx, gy)
    return loads, counter, (x, y, n_tiles)


def _key_blocks(m, sq, skv, causal, offset, block_m, block_n):
    """The key blocks query tile m sees (at least one): all Skv keys, or under causal those up to
    its last row's position."""
    hi = min(skv, min((m + 1) * block_m, sq) - 1 + offset + 1) if causal else skv
    return max(-(-hi // block_n), 1)


CASES = [  # (b, hq, sq, skv, causal, offset)
    (1, 1, 100, 100, False, 0), (2, 3, 1000, 1000, False, 0), (2, 8, 129, 129, False, 0),
    (1, 4, 4096, 4096, True, 0), (3, 5, 777, 777, True, 0), (2, 2, 300, 1300, True, 1000),
]


def _check(loads, b, hq, sq, skv, causal, offset, head_dim):
    cfg = tiles.ws_config("fp16", head_dim, causal)
    n_m = -(-sq // cfg["BLOCK_M"])
    got = sorted(t for mine in loads.values() for t in mine)
    want = sorted((bb, h, m, _key_blocks(m, sq, skv, causal, offset, cfg["BLOCK_M"], cfg["BLOCK_N"]))
                  for bb in range(b) for h in range(hq) for m in range(n_m))
    assert got == want


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("tiles_per_cta", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_per_tile_grid_loads_every_tile_once(case, tiles_per_cta, head_dim):
    """A CTA per tile (or per two consecutive tiles): grid (ceil(Sq / block_m), B x Hq), each CTA
    its own (batch, head)'s tiles, the last first."""
    b, hq, sq, skv, causal, offset = case
    loads, _, (x, y, n_tiles) = _ctas(b=b, hq=hq, sq=sq, skv=skv, causal=causal, head_dim=head_dim,
                                      tiles_per_cta=tiles_per_cta, offset=offset)
    assert y == b * hq and n_tiles == x * y
    _check(loads, b, hq, sq, skv, causal, offset, head_dim)
    for (gx, gy), mine in loads.items():
        assert {(bb * hq + h) for bb, h, _, _ in mine} <= {gy}
        assert [m for _, _, m, _ in mine] == sorted((m for _, _, m, _ in mine), reverse=True)


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("case", CASES + [(32, 16, 512, 512, False, 0), (1, 16, 16384, 16384, True, 0)])
def test_persistent_grid_loads_every_tile_once(case, head_dim):
    """PERSISTENT_GRID: one row of min(SMs, tiles) CTAs, each taking every CTAs-th tile of the
    call's B x Hq (batch, head) pairs (Q's first two dims); under causal each CTA's tiles longest
    first."""
    b, hq, sq, skv, causal, offset = case
    loads, _, (x, y, n_tiles) = _ctas(b=b, hq=hq, sq=sq, skv=skv, causal=causal, head_dim=head_dim,
                                      persistent=True, offset=offset)
    n_m = -(-sq // tiles.ws_config("fp16", head_dim, causal)["BLOCK_M"])
    assert (y, n_tiles) == (1, n_m * b * hq) and x == min(SMS, n_tiles)
    _check(loads, b, hq, sq, skv, causal, offset, head_dim)
    if causal:
        assert all([m for _, _, m, _ in mine] == sorted((m for _, _, m, _ in mine), reverse=True)
                   for mine in loads.values())


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("case", CASES[3:] + [(1, 16, 16384, 16384, True, 0), (32, 16, 512, 512, True, 0)])
def test_dynamic_tiles_load_every_tile_once(case, head_dim):
    """DYNAMIC_TILES: the CTAs claim tiles through the counter pair as they free up (their claims
    interleaved at random, their first ones too), each CTA's first tile is its program id, and the
    last CTA to finish zeroes the pair; within a group of heads the longest tiles go first."""
    b, hq, sq, skv, causal, offset = case
    for seed in range(4):
        loads, counter, (x, y, n_tiles) = _ctas(b=b, hq=hq, sq=sq, skv=skv, causal=causal, head_dim=head_dim,
                                                persistent=True, dynamic=True, offset=offset, seed=seed)
        n_m = -(-sq // tiles.ws_config("fp16", head_dim, causal)["BLOCK_M"])
        assert (y, n_tiles) == (1, n_m * b * hq)
        _check(loads, b, hq, sq, skv, causal, offset, head_dim)
        assert counter == [0, 0]
        gl = HostGl()
        grp = host(scheduler._head_group, gl)(skv, head_dim)
        order = [host(scheduler._tile_of, gl)(t, n_m, b * hq, grp, hq, 1) for t in range(n_tiles)]
        for (gx, _), mine in loads.items():  # its first tile: its program id's
            m_t, b_t, h_t, _, _ = order[gx]
            assert mine[0][:3] == (b_t, h_t, m_t)
        for t0 in range(0, len(order), grp * n_m):  # within a group of heads, longest tiles first
            ms = [m for m, *_ in order[t0:t0 + grp * n_m]]
            assert ms == sorted(ms, reverse=True)
