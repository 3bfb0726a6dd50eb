"""Count the CUDA cubins embedded in shared libraries, loose or inside a wheel: each must be there once.

A cubin is an ELF image whose e_machine is EM_CUDA (190); aot/build.py embeds them whole
(`.incbin` in kernels.gen.S), so each begins with an ELF header inside the host library.

    python tools/wheel_cubins.py dist/ort_flash-*.whl [--expect N]
    python tools/wheel_cubins.py libort_flash.so _C.cpython-311-x86_64-linux-gnu.so

Prints the count per library; with --expect N, exits 1 unless the total is N (the kernel table's
length) and no library but one holds any.
"""
from __future__ import annotations

import argparse
import hashlib
import struct
import sys
import zipfile

EM_CUDA = 190


def cubins(data: bytes) -> list[str]:
    """SHA-256 digests of the cubin images embedded in `data` (not counting `data`'s own header)."""
    found = []
    at = data.find(b"\x7fELF", 1)
    while at != -1:
        head = data[at:at + 64]
        if len(head) == 64 and head[4] == 2 and struct.unpack_from("<H", head, 18)[0] == EM_CUDA:
            shoff, = struct.unpack_from("<Q", head, 40)
            shentsize, shnum = struct.unpack_from("<HH", head, 58)
            end = at + shoff + shentsize * shnum  # the section header table closes a cubin
            found.append(hashlib.sha256(data[at:end]).hexdigest())
        at = data.find(b"\x7fELF", at + 1)
    return found


def libraries(paths: list[str]):
    """(name, bytes) of each shared library given, or inside each wheel given."""
    for path in paths:
        if path.endswith(".whl"):
            with zipfile.ZipFile(path) as z:
                for name in z.namelist():
                    if ".so" in name.rsplit("/", 1)[-1]:
                        yield name, z.read(name)
        else:
            with open(path, "rb") as f:
                yield path, f.read()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="wheels or shared libraries")
    p.add_argument("--expect", type=int, default=None, help="the number of kernels in the table")
    args = p.parse_args(argv)
    per_library = {name: cubins(data) for name, data in libraries(args.paths)}
    for name, found in per_library.items():
        print(f"{len(found):5d} cubins ({len(set(found))} distinct) in {name}")
    total = sum(len(f) for f in per_library.values())
    holders = [name for name, f in per_library.items() if f]
    if args.expect is None:
        return 0
    if total != args.expect or len(holders) > 1:
        print(f"FAIL: {total} cubins in {len(holders)} libraries; expected {args.expect}, each once, in one library")
        return 1
    print(f"OK: each of the {total} kernels' cubins once, in {holders[0] if holders else 'no library'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
