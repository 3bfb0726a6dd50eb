"""Models whose weights live beside the graph (ONNX external data), at any size.

An LLM's ``model.onnx`` holds its graph and ``model.onnx.data`` its weights. The rewriter works
on the graph only: ``load_graph`` keeps every large external tensor a reference to its file
(reading only the small ones, the scales, masks and shapes the rules read, into the proto), and
a rule that needs a large tensor's values (packed QKV weights) reads it through onnx_ir's
``ExternalTensor``, which maps the file. ``save`` writes the output as a graph plus one data
file, ``<output>.data``: each untouched weight is copied byte for byte from its input file by
the kernel (``os.copy_file_range``, no pass through this process's memory), new or changed
initializers are written after them, each at an offset aligned to 64 KiB (so that ONNX Runtime
can map it rather than read it). The output never refers to the input's files: it can be moved,
and the input can be deleted. A model with no external data is written as one file, unless it
would pass protobuf's 2 GB limit; then it is written with a data file too.

``save_atomic`` (what ``RewriteResult.save`` and ``ort-flash rewrite`` use) writes both files as
temp files in the output's folder and gives them their names only once both are complete: a
failure leaves no new or half-written file, an existing output keeps its content, and the model
keeps referring to its input's weights. ``write_atomic`` is the same for any one file.
"""

from __future__ import annotations

import os
import tempfile

import onnx
from onnx import external_data_helper as edh

# External tensors up to this size are read into the proto at load: shape constants, scales,
# masks, norms (what the rules and shape inference read); weights stay on disk.
SMALL_BYTES = 1 << 20
# Initializers of at least this size go to the data file when one is written (Optimum's and
# onnx's default threshold).
EXTERNAL_THRESHOLD = 1024
PROTOBUF_LIMIT = 2**31 - 1
# ONNX Runtime maps an external tensor whose offset is a multiple of the allocation
# granularity (the page size on Linux, 64 KiB on Windows) instead of copying it.
ALIGN = 64 << 10


class ExternalDataError(ValueError):
    """An external tensor's file is missing, or shorter than the tensor says."""


def tensors(model: onnx.ModelProto):
    """Every TensorProto of the model: initializers and tensor attributes, in every graph."""
    return edh._get_all_tensors(model)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in tensors(model) if edh.uses_external_data(t)]


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(edh.uses_external_data(t) for t in tensors(model))


def load_graph(path: str) -> tuple[onnx.ModelProto, bool]:
    """The model at ``path`` with its large external tensors left on disk (see the module
    docstring), and whether it had any external tensor; raises ExternalDataError, naming the
    tensor, for a missing or short data file."""
    model = onnx.load(path, load_external_data=False)
    had = False
    base_dir = os.path.dirname(os.path.abspath(path))
    sizes: dict[str, int] = {}
    for tensor in external_tensors(model):
        had = True
        info = edh.ExternalDataInfo(tensor)
        file = os.path.join(base_dir, info.location)
        if info.location not in sizes:
            if not os.path.isfile(file):
                raise ExternalDataError(f"tensor {tensor.name!r}: its external data file "
                                        f"{info.location} is missing (looked in {base_dir})")
            sizes[info.location] = os.path.getsize(file)
        offset = info.offset or 0
        length = sizes[info.location] - offset if info.length is None else info.length
        if offset + length > sizes[info.location]:
            raise ExternalDataError(f"tensor {tensor.name!r}: its external data file "
                                    f"{info.location} is shorter than the tensor")
        if length <= SMALL_BYTES:
            edh.load_external_data_for_tensor(tensor, base_dir)
    return model, had


def file_has_external_data(path: str) -> bool:
    """Whether the model file at ``path`` keeps tensors as external data (the graph is parsed,
    no tensor read)."""
    return has_external_data(onnx.load(path, load_external_data=False))


def load_all(model: onnx.ModelProto, base_dir: str) -> None:
    """Read every external tensor into the proto (for tools that need all values in memory,
    such as ONNX Runtime's optimizer and float16 converter)."""
    edh.load_external_data_for_model(model, base_dir)


def byte_size(model: onnx.ModelProto) -> int:
    """The serialized size, or more than PROTOBUF_LIMIT where protobuf cannot say (upb raises
    instead of returning a size above 2 GB)."""
    try:
        return model.ByteSize()
    except Exception:  # noqa: BLE001 - EncodeError (upb), ValueError (others)
        return PROTOBUF_LIMIT + 1


def needs_data_file(model: onnx.ModelProto) -> bool:
    """Whether ``save`` writes a data file for ``model``: it has external tensors, or it would
    not fit in one protobuf message (a margin left for the serializer's own fields)."""
    return has_external_data(model) or byte_size(model) >= PROTOBUF_LIMIT - (16 << 20)


def data_file_name(path: str) -> str:
    return os.path.basename(path) + ".data"


def save(model: onnx.ModelProto, path: str, base_dir: str = "", *, external: bool = False,
         name: str | None = None, data_path: str | None = None) -> str | None:
    """Write ``model`` to ``path``; its external tensors are read from ``base_dir``. Where
    ``needs_data_file``, the weights go to ``data_path`` (default ``path + ".data"``), referred to
    by the name ``data_file_name(path)``, as the module docstring says; as onnx.save_model with
    external data does, ``model``'s tensors then refer to that file (their raw bytes leave
    memory; where the graph's write fails they get their data back). ``external``: write a data
    file anyway (the input had one). Returns the data file's path, or None where the model was
    written as one file. Not atomic: ``save_atomic`` is."""
    if not (external or needs_data_file(model)):
        onnx.save_model(model, path)
        return None
    data_path = data_path or path + ".data"
    location = data_file_name(name or path)
    placed = []  # (tensor, offset, length) in the new file
    sources: dict[str, object] = {}
    try:
        with open(data_path, "wb") as out:
            for tensor in tensors(model):
                if edh.uses_external_data(tensor):
                    info = edh.ExternalDataInfo(tensor)
                    src = sources.get(info.location)
                    if src is None:
                        src = sources[info.location] = open(os.path.join(base_dir, info.location), "rb")
                    length = info.length
                    if length is None:
                        length = os.fstat(src.fileno()).st_size - (info.offset or 0)
                    placed.append((tensor, _copy_range(src, info.offset or 0, length, out), length))
                elif tensor.HasField("raw_data") and len(tensor.raw_data) >= EXTERNAL_THRESHOLD:
                    offset = _pad(out)
                    out.write(tensor.raw_data)
                    placed.append((tensor, offset, out.tell() - offset))
    finally:
        for src in sources.values():
            src.close()
    before = [([(e.key, e.value) for e in tensor.external_data], tensor.data_location)
              for tensor, _, _ in placed]
    for tensor, offset, length in placed:
        if not tensor.HasField("raw_data"):
            tensor.raw_data = b""  # set_external_data asks for the field
        edh.set_external_data(tensor, location, offset, length)
        tensor.ClearField("raw_data")
    try:
        onnx.save_model(model, path)
    except BaseException:
        _undo(placed, before, data_path)
        raise
    return data_path


def _undo(placed: list, before: list, data_path: str) -> None:
    """Give the tensors ``save`` moved into ``data_path`` their former data back: the external
    references they had, or their bytes, read back from ``data_path`` (the graph's write failed)."""
    with open(data_path, "rb") as data:
        for (tensor, offset, length), (entries, location) in zip(placed, before):
            del tensor.external_data[:]
            for key, value in entries:
                tensor.external_data.add(key=key, value=value)
            tensor.data_location = location
            if location != onnx.TensorProto.EXTERNAL:
                data.seek(offset)
                tensor.raw_data = data.read(length)


def save_atomic(model: onnx.ModelProto, path: str, base_dir: str = "", *,
                external: bool = False) -> str | None:
    """``save`` as the module docstring says: through temp files in ``path``'s folder, the data
    file (where one is written) renamed to ``path + ".data"`` first, then the graph that refers
    to it to ``path``. Where anything fails, both temp files are removed, nothing at ``path`` or
    its data file changes, and ``model`` is as it was; an OSError names ``path``. Returns the
    data file's path, or None."""
    data_path = path + ".data"
    data_tmp = _temp_beside(data_path)
    written = []

    def graph(tmp: str) -> None:
        written.append(save(model, tmp, base_dir, external=external, name=path, data_path=data_tmp))

    try:
        write_atomic(path, graph, before_replace=lambda: written[0] and os.replace(data_tmp, data_path))
    finally:
        _remove(data_tmp)
    return data_path if written[0] else None


def write_atomic(path: str, write, before_replace=None) -> None:
    """Write ``path`` through a temp file in its folder, then ``os.replace``: the file appears
    whole or not at all. ``write(tmp_path)`` writes the content; ``before_replace()``, where
    given, runs after it, just before the file takes its name. An OSError names ``path``."""
    tmp = _temp_beside(path)
    try:
        write(tmp)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise OSError(e.errno, f"{path}: cannot write there: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        raise


def _temp_beside(path: str) -> str:
    """An empty temp file in ``path``'s folder, with the mode a new file gets there."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:  # name the file asked for, not the temp file
        raise OSError(e.errno, f"{path}: cannot write there: {e.strerror or e}") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
    return tmp


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _pad(out) -> int:
    offset = out.tell()
    aligned = -(-offset // ALIGN) * ALIGN
    if aligned != offset:
        out.write(b"\0" * (aligned - offset))
    return aligned


def _copy_range(src, offset: int, length: int, out) -> int:
    """Copy ``length`` bytes at ``offset`` of ``src`` to the end of ``out`` (aligned); returns
    where they start in ``out``."""
    start = _pad(out)
    out.flush()
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(src.fileno(), out.fileno(), length - done,
                                   offset + done, start + done)
            if n == 0:
                raise ExternalDataError(f"{src.name}: shorter than its tensors say")
            done += n
    except OSError:  # no copy_file_range here (another file system): copy through a buffer
        src.seek(offset + done)
        out.seek(start + done)
        remaining = length - done
        while remaining:
            chunk = src.read(min(remaining, 16 << 20))
            if not chunk:
                raise ExternalDataError(f"{src.name}: shorter than its tensors say") from None
            out.write(chunk)
            remaining -= len(chunk)
    out.seek(start + length)
    return start


