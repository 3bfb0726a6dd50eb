"""The warp-specialized Hopper (sm_90) FlashAttention forward kernel in Gluon, by role (the layout of
FlashAttention-3's hopper/: the partitions' structs and tile configuration, scheduler, producer,
main loop and softmax; the epilogue and the wgmma layouts are aot/flash_fwd_gluon.py's, shared
with the one-partition kernel). The entry point, flash_fwd_gluon_ws, is aot/flash_fwd_gluon_ws.py; the kernel's tiles
are data in aot/tiles.py (WS_TILES), which variants.py turns into its cubins.

One CTA owns BLOCK_M query rows of one (batch, head): NUM_CONSUMERS (2 or 3) consumer warpgroups
of BLOCK_M / NUM_CONSUMERS rows each (the default partition and the first workers) and a one-warp
producer (the last worker, few registers) that loads Q once and streams K_j, V_j through
NUM_STAGES-deep rings (producer.py). Each slot has a `ready` barrier (TMA bytes landed) and an
`empty` barrier that every consumer arrives on once its wgmma has read it; no CTA-wide barrier in
the loop. A consumer (mainloop.py) issues S_j = Q K_j^T and P_{j-1} V_{j-1} back to back as async
wgmma groups, retires S_j, runs the softmax of block j (softmax.py) while P V is in flight, then
retires P V; its epilogue (flash_fwd_gluon.py _epilogue) normalizes and stores its rows through its Q slot. With
PINGPONG the consumers take turns issuing their GEMMs (one mbarrier each, round robin), so one's
softmax runs under another's tensor-core work (FA3's inter-warpgroup schedule).

Which tiles a CTA runs is the scheduler's (scheduler.py): one tile, TILES_PER_CTA consecutive
tiles (the next tile's loads under this one's epilogue: Q double-buffered, ring phases and turns
as running counts over the CTA's tiles), a persistent grid (PERSISTENT_GRID) or dynamic tiles
(DYNAMIC_TILES). Under a key-vector mask every cubin first checks whether the keys a tile sees
show one visible run and then runs unmasked over it (mask_prefix.py). SKIP_PAST_ROWS lets a
consumer without rows in a tile pass its barriers without GEMMs (mainloop.py _consumer_pass).
Which grid each cubin runs is the variant table's (aot/tiles.py GLUON_WS_GRIDS, read by aot/variants.py).
"""
