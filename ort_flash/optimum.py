"""Hugging Face Optimum model folders: every ONNX file rewritten, every other file copied.

An Optimum export folder (what ``optimum-cli export onnx`` writes, and what
``ORTModelFor<Task>.from_pretrained`` loads) holds one or more ONNX files at its top level
(``model.onnx``; ``encoder_model.onnx`` and ``decoder_model.onnx``, ``decoder_with_past_model.onnx``,
``decoder_model_merged.onnx``; their weights as external data beside them), ``config.json`` and
the tokenizer, generation and processor files.

    from ort_flash import optimum
    optimum.write_folder("gpt2-onnx", "gpt2-flash", lambda src, dst: rewrite_and_save(src, dst))

``write_folder`` builds the whole output in a scratch folder beside ``out_folder`` and moves it
into place once every file is written, so a failure leaves nothing behind. The source's external
data files are not copied: each rewritten model is written with its own. Pure Python: no
optimum import.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

CONFIG_NAME = "config.json"


class OptimumFolderError(ValueError):
    """A folder this module cannot handle, or cannot write; the message says why in one line."""


def onnx_files(folder: str | os.PathLike) -> list[Path]:
    """The ONNX files at the folder's top level, by name."""
    return sorted(p for p in Path(folder).iterdir() if p.suffix == ".onnx" and p.is_file())


def is_optimum(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding Hugging Face's ``config.json`` and ONNX files at its
    top level (an Optimum export)."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG_NAME).is_file() and bool(onnx_files(path))


def check_output_folder(src_folder: str | os.PathLike, out_folder: str | os.PathLike,
                        overwrite: bool = False) -> Path:
    """``out_folder`` resolved, or OptimumFolderError where ``write_folder`` would refuse it: equal
    to, inside or above the source folder, a file, or an existing non-empty folder unless
    ``overwrite``."""
    from ort_flash.genai import check_apart

    return check_apart(src_folder, out_folder, overwrite, OptimumFolderError, "an Optimum folder")


def write_folder(src_folder: str | os.PathLike, out_folder: str | os.PathLike,
                 write_model: Callable[[Path, Path], None], *, overwrite: bool = False) -> list[Path]:
    """Make ``out_folder`` the Optimum folder ``src_folder`` is, with every top-level ONNX file
    replaced by what ``write_model(source_file, output_file)`` writes (the model and any external
    data it needs, beside ``output_file``). Every other file is copied, except the source models'
    external data. Returns the written model files.

    Refuses (OptimumFolderError) a source without ``config.json`` or ONNX files, and an output
    ``check_output_folder`` refuses; whatever ``write_model`` raises leaves ``out_folder`` as it
    was."""
    from ort_flash.genai import external_data_files

    src = Path(src_folder)
    if not is_optimum(src):
        raise OptimumFolderError(f"{src} is not an Optimum model folder: it needs {CONFIG_NAME} and ONNX "
                                 "files at its top level")
    out = check_output_folder(src, out_folder, overwrite)
    models = onnx_files(src)
    skip = {m.name for m in models}
    for m in models:
        skip |= {os.path.normpath(f) for f in external_data_files(m)}
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src)
            if path.is_dir() or str(rel) in skip:
                continue
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, scratch / rel)
        written = []
        for m in models:
            write_model(m, scratch / m.name)
            if not (scratch / m.name).is_file():
                raise OptimumFolderError(f"write_model wrote no model for {m.name}")
            written.append(out / m.name)
        os.chmod(scratch, 0o777 & ~_umask())
        if out.exists():
            shutil.rmtree(out)
        os.replace(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return written


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def rewrite_folder(src_folder: str | os.PathLike, out_folder: str | os.PathLike, *, overwrite: bool = False,
                   **rewrite_options) -> dict:
    """``ort-flash rewrite FOLDER -o OUT`` from Python: every top-level ONNX file of the Optimum
    folder through ``ort_flash.rewrite(**rewrite_options)``, written with its weights beside it,
    every other file copied (``write_folder``). Returns each file's RewriteReport by name."""
    from ort_flash.rewriter import rewrite

    reports = {}

    def write(source: Path, output: Path) -> None:
        result = rewrite(str(source), **rewrite_options)
        result.save(output)
        reports[source.name] = result.report

    write_folder(src_folder, out_folder, write, overwrite=overwrite)
    return reports
