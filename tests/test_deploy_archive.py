"""The C/C++ deployment archive (tools/build_archive.sh): examples/cpp builds from the archive
alone (find_package(ort_flash) for the library and the headers; ONNX Runtime's shared library
from the onnxruntime wheel, as a deployer's host provides it) and runs the archive's rewritten
model like Python does.

The archive is built here from the installed library, or taken from ORT_FLASH_ARCHIVE (a file, or
a folder holding one; CI gives it dist/, where it built one from the wheel)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import ort_flash
from test_cpp_deploy import BATCH, SEQ, _cxx_compiler, _ort_include_dir, _ort_library, _run, check_like_python

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    given = os.environ.get("ORT_FLASH_ARCHIVE")
    if given:
        path = Path(given).resolve()
        if path.is_dir():
            (path,) = path.glob("ort_flash-*-linux_x86_64.tar.gz")
        return path
    if _ort_include_dir() is None:
        pytest.skip("ONNX Runtime C++ headers not found (build ort_flash once: it caches them)")
    out = tmp_path_factory.mktemp("archive")
    proc = subprocess.run(["bash", str(REPO / "tools" / "build_archive.sh"), ort_flash.library_path(), str(out)],
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("ort_flash-*-linux_x86_64.tar.gz")
    return path


@pytest.fixture(scope="module")
def unpacked(archive, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(archive) as t:
        t.extractall(dest, filter="data")
    (root,) = dest.iterdir()
    return root


def test_the_archive_holds_what_a_deployer_needs(unpacked):
    for part in ("README.md", "lib/libort_flash.so", "lib/cmake/ort_flash/ort_flashConfig.cmake",
                 "lib/cmake/ort_flash/ort_flashConfigVersion.cmake", "include/onnxruntime/onnxruntime_cxx_api.h",
                 "examples/cpp/CMakeLists.txt", "examples/cpp/run_model.cc",
                 "share/ort_flash/gpt2_tiny.flash.onnx"):
        assert (unpacked / part).is_file(), part
    assert f"ort_flash {ort_flash.__version__}" in (unpacked / "README.md").read_text()


def test_the_example_builds_from_the_archive_and_runs_its_model(unpacked, tmp_path):
    if not shutil.which("cmake") or not _cxx_compiler():
        pytest.skip("needs cmake and a C++ compiler")
    library = _ort_library()
    if library is None:
        pytest.skip("the installed onnxruntime package ships no libonnxruntime.so*")
    # Only the archive and ONNX Runtime's shared library: no checkout path, no ORT_INCLUDE_DIR.
    configure = ["cmake", "-S", str(unpacked / "examples" / "cpp"), "-B", str(tmp_path / "build"),
                 "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={unpacked}", f"-DORT_LIBRARY={library}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    proc = subprocess.run(configure, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ort_flash {ort_flash.__version__}, {unpacked}/lib/libort_flash.so" in proc.stdout, proc.stdout
    proc = subprocess.run(["cmake", "--build", str(tmp_path / "build"), "--parallel", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = unpacked / "share" / "ort_flash" / "gpt2_tiny.flash.onnx"
    # No library argument: the program loads the one find_package(ort_flash) gave it.
    run = _run(tmp_path / "build" / "ort_flash_run", str(model), "--batch", str(BATCH), "--seq", str(SEQ))
    assert run.returncode == 0, run.stdout + run.stderr
    check_like_python(run.stdout, model)


def test_find_package_refuses_another_minor_version(unpacked, tmp_path):
    if not shutil.which("cmake"):
        pytest.skip("needs cmake")
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(probe NONE)\n"
        "find_package(ort_flash 0.99 CONFIG QUIET)\nmessage(STATUS \"found=${ort_flash_FOUND}\")\n"
        "find_package(ort_flash 0.1 CONFIG REQUIRED)\nmessage(STATUS \"lib=${ort_flash_LIBRARY}\")\n")
    proc = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "b"), f"-DCMAKE_PREFIX_PATH={unpacked}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "found=0" in proc.stdout and f"lib={unpacked}/lib/libort_flash.so" in proc.stdout, proc.stdout
