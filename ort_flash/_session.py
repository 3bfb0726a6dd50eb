"""Where the custom-op library lives, and ONNX Runtime sessions that have it registered."""
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


def _preload_cuda(providers) -> None:
    """onnxruntime-gpu finds the CUDA/cuDNN libraries of the nvidia-* wheels only after
    preload_dlls(); harmless where they are absent."""
    import onnxruntime as ort

    names = [p[0] if isinstance(p, (tuple, list)) else p for p in (providers or [])]
    if "CUDAExecutionProvider" in names and hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - missing optional CUDA wheels; ORT reports later
            pass


# The op versions the library implements. A plain onnxruntime session cannot refuse a later
# import: ORT registers a custom-op domain for opsets 1-1000 with one schema per op name (since
# its start version), so ("ort_flash", 2 or 99) resolves to the version-1 schema and kernel, even
# with the op's end version set to 1 (tried on onnxruntime 1.31.1: versions 1, 2, 99 all load and
# run); the kernel sees only that since-version, not the import. So it is checked here instead.
OP_VERSIONS = (1,)


def check_op_version(model) -> None:
    """Raise ValueError when the model imports an ort_flash opset the library does not implement.

    `model` is a path, serialized bytes or an `onnx.ModelProto` (external data is not read)."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    for imp in getattr(model, "opset_import", ()):
        if imp.domain == "ort_flash" and imp.version not in OP_VERSIONS:
            raise ValueError(
                f"the model imports opset ('ort_flash', {imp.version}); this ort_flash library "
                f"implements version {', '.join(map(str, OP_VERSIONS))} of FlashAttention only: "
                f"rewrite the original model with this ort_flash, or install the version that "
                f"wrote it")


def InferenceSession(model, providers=None, sess_options=None, **kwargs):
    """`onnxruntime.InferenceSession` with ort_flash registered.

    `model` is a path, serialized bytes or an `onnx.ModelProto`. `providers` defaults to
    CUDA (when ONNX Runtime has it and the driver sees a GPU) then CPU. Asking for CUDA where the
    installed ONNX Runtime is the CPU package raises RuntimeError saying so (ONNX Runtime would
    run on the CPU with a warning).
    """
    from ._onnxruntime import check_providers, import_onnxruntime

    ort = import_onnxruntime()

    if providers is None:
        from ort_flash._cuda_device import cuda_device_arch

        # onnxruntime-gpu lists CUDA on machines without a GPU too, and then logs its failure.
        available = ort.get_available_providers()
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available
                     and (p != "CUDAExecutionProvider" or cuda_device_arch() is not None)]
    check_providers(providers)
    _preload_cuda(providers)
    check_op_version(model)
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, sess_options=session_options(sess_options),
                                providers=providers, **kwargs)
