"""ONNX Runtime GenAI model folders: find the decoder, write a folder whose decoder is rewritten.

A GenAI folder (what GenAI's model builder writes) holds ``genai_config.json``, the decoder
model it names (``model.decoder.filename``) with its external data, and the tokenizer files.
GenAI registers a custom-op library named in a ``session_options`` block of that config
(``"custom_ops_library"``) and accepts only a file inside the model folder, an execution
provider's library folder or the working directory, with no ``..`` in the path; so
``write_folder`` copies libort_flash.so into the folder and names it by its file name.

    from ort_flash import genai
    genai.write_folder("phi3-genai", "phi3-genai-flash", lambda path: save(rewritten, path))

Only decoder-only folders are handled: a decoder split into a pipeline of models, or a folder
with other models (vision, speech, embedding, encoder, ...) is refused with the reason. The
provider the folder was built for (``provider_options``) is kept as it is. Pure Python: no
onnxruntime_genai import.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Callable

CONFIG_NAME = "genai_config.json"
# genai_config.json's model entries other than the decoder; a folder with any is refused.
OTHER_MODELS = ("encoder", "vision", "speech", "embedding", "draft", "joiner", "vad", "mtp")


class GenAIFolderError(ValueError):
    """A GenAI folder this module cannot handle, or cannot write; the message says why in one line."""


@dataclasses.dataclass(frozen=True)
class GenAIFolder:
    folder: Path   # the folder holding genai_config.json
    config: dict   # genai_config.json, parsed
    decoder: Path  # the decoder model file genai_config.json names

    @property
    def providers(self) -> list[str]:
        """The execution providers the decoder's session options name (empty: CPU)."""
        options = self.config["model"]["decoder"].get("session_options", {})
        return [name for entry in options.get("provider_options", []) for name in entry]


def is_genai(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a GenAI folder or a model file inside one."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return (folder / CONFIG_NAME).is_file()


def open_folder(path: str | os.PathLike) -> GenAIFolder:
    """The GenAI folder at ``path``: the folder itself, or a model file inside one (which must
    be the decoder its genai_config.json names). Raises GenAIFolderError saying why not."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise GenAIFolderError(f"{path} is not a GenAI folder: no {CONFIG_NAME} in {folder}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GenAIFolderError(f"{config_path} is not readable JSON: {e}") from None
    model = config.get("model") if isinstance(config, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(decoder, dict):
        raise GenAIFolderError(f"{config_path} has no model.decoder entry")
    others = [name for name in OTHER_MODELS if model.get(name)]
    if others:
        raise GenAIFolderError(f"{config_path} names other models beside the decoder ({', '.join(others)}); "
                               "only decoder-only GenAI folders are supported")
    if decoder.get("pipeline"):
        raise GenAIFolderError(f"{config_path} splits the decoder into a pipeline of "
                               f"{len(decoder['pipeline'])} models; only a single decoder model is supported")
    filename = decoder.get("filename")
    if not isinstance(filename, str) or not filename:
        raise GenAIFolderError(f"{config_path} names no model.decoder.filename")
    if Path(filename).is_absolute() or ".." in Path(filename).parts:
        raise GenAIFolderError(f"{config_path}: model.decoder.filename {filename!r} is not a path inside the folder")
    decoder_path = folder / filename
    if not decoder_path.is_file():
        raise GenAIFolderError(f"{config_path} names the decoder {filename!r}, which is not in {folder}")
    if not path.is_dir() and path.resolve() != decoder_path.resolve():
        raise GenAIFolderError(f"{path} is not the decoder of its GenAI folder ({CONFIG_NAME} names {filename!r})")
    return GenAIFolder(folder, config, decoder_path)


def external_data_files(model_path: str | os.PathLike) -> list[str]:
    """The external data files (relative to the model's folder) that the model's tensors name,
    read without loading the data."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    files = []
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location and location not in files:
                files.append(location)
    return files


def _tensors(graph):
    """Every tensor a graph holds: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)


def check_output_folder(source: GenAIFolder, out_folder: str | os.PathLike, overwrite: bool = False) -> Path:
    """``out_folder`` resolved, or GenAIFolderError where ``write_folder`` would refuse it: equal
    to, inside or above the source folder, or an existing non-empty folder unless ``overwrite``."""
    return check_apart(source.folder, out_folder, overwrite, GenAIFolderError, "a GenAI folder")


def check_apart(src_folder: str | os.PathLike, out_folder: str | os.PathLike, overwrite: bool,
                error: type[Exception], kind: str) -> Path:
    """``out_folder`` resolved, or ``error`` where a folder written from ``src_folder`` may not go
    there: equal to, inside or above it, a file, or an existing non-empty folder unless
    ``overwrite``. ``kind`` names what is written ("a GenAI folder")."""
    src, out = Path(src_folder).resolve(), Path(out_folder).resolve()
    if out == src or out in src.parents or src in out.parents:
        raise error(f"the output folder {out} must be apart from the source folder {src} "
                    "(not the same, inside it or above it)")
    if out.exists() and not out.is_dir():
        raise error(f"the output {out} is a file; {kind} is written as a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise error(f"the output folder {out} exists and is not empty (overwrite it to replace it)")
    return out


def write_folder(src_folder: str | os.PathLike, out_folder: str | os.PathLike,
                 write_model: Callable[[Path], None], *, copy_model_data: bool = False,
                 overwrite: bool = False, library: str | os.PathLike | None = None) -> Path:
    """Make ``out_folder`` a complete GenAI folder whose decoder is what ``write_model`` writes.

    ``write_model(path)`` writes the decoder model at ``path`` (the name genai_config.json gives
    it, in ``out_folder``) with any external data it needs. Every other file of ``src_folder`` is
    copied, except the source decoder's external data, unless ``copy_model_data`` (for a model
    written to refer to those files by the same names). genai_config.json names the custom-op
    library in ``model.decoder.session_options`` and the library (``library``, default
    ``ort_flash.library_path()``) is copied beside it. Returns ``out_folder``.

    Refuses (GenAIFolderError) ``out_folder`` equal to, inside or above ``src_folder``, an
    existing non-empty ``out_folder`` unless ``overwrite``, and a source config that already
    names a custom-op library."""
    source = open_folder(src_folder)
    out = check_output_folder(source, out_folder, overwrite)
    options = source.config["model"]["decoder"].get("session_options", {})
    if options.get("custom_ops_library"):
        raise GenAIFolderError(f"{source.folder / CONFIG_NAME} already names a custom-op library "
                               f"({options['custom_ops_library']!r}); GenAI registers one per session")
    if library is None:
        from ort_flash import library_path
        library = library_path()
    library = Path(library)
    if not library.is_file():
        raise GenAIFolderError(f"the custom-op library {library} does not exist")
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)

    decoder_rel = source.decoder.relative_to(source.folder)
    skip = {decoder_rel, Path(CONFIG_NAME), Path(library.name)}
    if not copy_model_data:
        skip |= {Path(os.path.normpath(decoder_rel.parent / f)) for f in external_data_files(source.decoder)}
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.folder.rglob("*")):
        rel = path.relative_to(source.folder)
        if path.is_dir() or rel in skip:
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out / rel)
    shutil.copy2(library, out / library.name)

    config = json.loads(json.dumps(source.config))  # a deep copy
    config["model"]["decoder"].setdefault("session_options", {})["custom_ops_library"] = library.name
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=4) + "\n")

    decoder = out / decoder_rel
    decoder.parent.mkdir(parents=True, exist_ok=True)
    write_model(decoder)
    if not decoder.is_file():
        raise GenAIFolderError(f"write_model wrote no model at {decoder}")
    missing = [f for f in external_data_files(decoder) if not (decoder.parent / f).is_file()]
    if missing:
        raise GenAIFolderError(f"{decoder} refers to external data {', '.join(missing)} that is not in {out} "
                               "(write it with the model, or pass copy_model_data to copy the source's)")
    return out
