"""Where the custom-op library and the compiled module live, and SessionOptions that register the
library. The ground floor of ort_flash: it imports only ``_onnxruntime`` (and ``_C``), so that the
rewriter (its output check loads the rewritten model in a session) and the session helpers above
it can both use it."""
from __future__ import annotations

import importlib.resources
import os
import sys
from pathlib import Path

LIBRARY_NAME = "libort_flash.so"


def library_path() -> str:
    """Absolute path of the ONNX Runtime custom-op library (libort_flash.so).

    Register it in any ONNX Runtime session: Python `SessionOptions.register_custom_ops_library`,
    C `RegisterCustomOpsLibrary_V2`, C++ `Ort::SessionOptions::RegisterCustomOpsLibrary`.
    """
    override = os.environ.get("ORT_FLASH_LIBRARY")
    if override:
        return str(Path(override).resolve())
    candidate = importlib.resources.files("ort_flash").joinpath(LIBRARY_NAME)
    if candidate.is_file():
        return str(Path(str(candidate)).resolve())
    # Editable installs place compiled files beside the extension module, not the sources.
    path = Path(load_extension().__file__).resolve().with_name(LIBRARY_NAME)
    if not path.is_file():
        raise FileNotFoundError(f"{LIBRARY_NAME} not found beside {path.parent}; reinstall ort_flash "
                                "(pip install . in its source folder)")
    return str(path)


def load_extension():
    """The compiled pybind11 module ``ort_flash._C`` (kernel table, launch plans), or
    FileNotFoundError saying why it is missing and what to do."""
    try:
        from . import _C
    except ImportError as e:
        raise FileNotFoundError(_not_built_message(e)) from None
    return _C


def _not_built_message(error: Exception) -> str:
    """Why the imported ort_flash has no compiled parts. The common case is a source checkout
    that shadows the installed package: Python imports ./ort_flash (the current folder comes
    first on sys.path), which holds only the sources after a non-editable `pip install .`."""
    here = Path(__file__).resolve().parent
    installed = [d for d in _installed_copies() if d != here]
    if installed:
        return (f"Python imported ort_flash from the source folder {here}, which shadows the "
                f"installed package in {installed[0]} (the compiled {LIBRARY_NAME} is there, not "
                "here): run from another folder, or install the checkout editable with "
                "`pip install -e .`")
    if (here.parent / "pyproject.toml").is_file():
        return (f"ort_flash is imported from its source folder {here}, which holds no compiled "
                f"{LIBRARY_NAME}: build and install it with `pip install -e .` in {here.parent}")
    return f"{LIBRARY_NAME} is not installed with ort_flash in {here}; reinstall ort_flash ({error})"


def _installed_copies() -> list[Path]:
    """Folders named ort_flash on sys.path that hold the compiled library."""
    found = []
    for entry in sys.path:
        folder = Path(entry or os.getcwd()).resolve() / "ort_flash"
        if (folder / LIBRARY_NAME).is_file() and folder not in found:
            found.append(folder)
    return found


def _check_loadable(path: str) -> None:
    """Raise OSError for a file that dlopen would crash on rather than refuse: a truncated
    library (a segment past the end of the file) faults the process with SIGBUS when mapped."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # ELF, 64-bit
                raise OSError("not a 64-bit ELF shared library")
            (phoff,) = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError as e:
        raise OSError(f"{path}: cannot load the ort_flash library: {e.strerror or e}") from None
    if len(table) < phentsize * phnum or phentsize < 40:
        raise OSError(f"{path}: cannot load the ort_flash library: truncated (program headers)")
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD past the end of the file
            raise OSError(f"{path}: cannot load the ort_flash library: truncated "
                          f"({size} bytes, a segment ends at {p_offset + p_filesz})")


def session_options(so=None):
    """`onnxruntime.SessionOptions` with the ort_flash library registered (a new one if None).

    Raises OSError for a library file that is missing, not a shared library or truncated, and
    ImportError (one line: what to install) where no ONNX Runtime is installed."""
    from ._onnxruntime import import_onnxruntime

    ort = import_onnxruntime()

    path = library_path()
    if sys.platform.startswith("linux"):
        _check_loadable(path)
    so = ort.SessionOptions() if so is None else so
    so.register_custom_ops_library(path)
    return so
