"""The kernel table as aot/variants.py would have the build make it, as rows of its codes and
tiles: what ort_flash._C's plan_with_table and launch_with_table take in place of the compiled
table (tests/test_gluon_aot.py, tests/test_launch_abi.py, tests/test_aot_table.py)."""
from __future__ import annotations

import sys

from aot import build, variants


def row(x, arch: int) -> dict:
    """Variant x's table row on `arch`."""
    v = variants
    cfg = v.get_fwd_config(arch, x)
    return dict(variant=x.name, dtype=v.DTYPE_CODES[x.dtype], head_dim=x.head_dim, even_d=x.even_d,
                mask=v.MASK_KINDS[x.mask], extras=x.extras, kind=v.KIND_CODES[x.kind],
                precision=v.PRECISION_CODES[x.precision] if x.dtype == "fp32" else 0,
                mask_keys=x.mask_keys, num_warps=cfg.num_warps, block_m=cfg.block_m,
                block_n=cfg.block_n, tile_causal=x.tile_causal, tile_min_len=x.tile_min_len,
                tile_max_len=x.tile_max_len, persistent=cfg.persistent, dynamic=cfg.dynamic,
                pdl=x.kind == "decode" and arch >= build.PDL_MIN_ARCH)


def table_rows(arch: int, gluon: bool = True, combinations: bool = False) -> list[dict]:
    """One row per variant the build compiles for `arch` (without the Gluon ones: gluon False; every
    combination, also those a superset variant serves: combinations True), from variants' tables
    as this process holds them (the shipped grids, unless a caller replaced the module's)."""
    vs = variants.all_combinations() if combinations else variants.all_variants()
    return [row(x, arch) for x in vs if arch >= x.min_arch and (gluon or x.kind != "fwd_gluon")]


if __name__ == "__main__":  # the rows as JSON: `PYTHONPATH=. python tests/_table_rows.py 90`
    import json

    print(json.dumps(table_rows(int(sys.argv[1]))))
