"""Each cubin once: the pybind11 module reads the kernel table from libort_flash.so and embeds no
cubin of its own (tools/wheel_cubins.py, which CI also runs on the built wheel)."""
from __future__ import annotations

import struct
import sys
import zipfile
from pathlib import Path

import ort_flash
from ort_flash._library import load_extension

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import wheel_cubins  # noqa: E402


def _fake_elf(machine: int, body: bytes) -> bytes:
    """A 64-bit ELF header for `machine` whose section header table (1 entry of 64 bytes) follows `body`."""
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<H", head, 18, machine)
    struct.pack_into("<Q", head, 40, 64 + len(body))   # e_shoff
    struct.pack_into("<HH", head, 58, 64, 1)           # e_shentsize, e_shnum
    return bytes(head) + body + bytes(64)


def test_the_counter_finds_embedded_cubins_only(tmp_path):
    a, b = _fake_elf(190, b"kernel a"), _fake_elf(190, b"kernel b")
    host = _fake_elf(62, b"x86 code") + a + b"\0" * 3 + b + a + _fake_elf(62, b"not a cubin")
    assert len(wheel_cubins.cubins(host)) == 3 and len(set(wheel_cubins.cubins(host))) == 2
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/libone.so", host)
        z.writestr("pkg/_C.cpython-311-x86_64-linux-gnu.so", _fake_elf(62, b"module"))
        z.writestr("pkg/__init__.py", a)  # not a library: not counted
    assert wheel_cubins.main([str(wheel), "--expect", "3"]) == 0
    assert wheel_cubins.main([str(wheel), "--expect", "4"]) == 1
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("pkg/libtwo.so", _fake_elf(62, b"copy") + a)
    assert wheel_cubins.main([str(wheel), "--expect", "4"]) == 1  # 4 cubins, but in two libraries


def test_the_installed_module_embeds_no_cubin_and_the_library_all():
    _C = load_extension()
    library = Path(ort_flash.library_path())
    module = Path(_C.__file__)
    assert len(wheel_cubins.cubins(module.read_bytes())) == 0, f"{module} embeds cubins"
    assert len(wheel_cubins.cubins(library.read_bytes())) == len(_C.kernels())
