"""The user's choice of ONNX Runtime: the extras, and the one-line messages where none, or two
packages of it, are installed, or CUDA is asked of the CPU package.

The environments are faked (the packages found, a `None` in sys.modules for "not importable",
a dist-info folder on PYTHONPATH for a second package), so no scratch venvs are built here; CI's wheel job (tools/check_wheel.sh) installs the real `[cpu]` extra.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import ort_flash
from ort_flash import _onnxruntime, cli

ROOT = Path(__file__).resolve().parent.parent
CPU_ONLY = ["CPUExecutionProvider"]


def _fake_installed(monkeypatch, dists: dict[str, str], importable: bool = True):
    """The ONNX Runtime packages installed are exactly `dists` (name: version)."""
    monkeypatch.setattr(_onnxruntime, "installed", lambda: list(dists.items()))
    if not importable:
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails


def _model_path() -> str:
    from ort_flash.demo import demo_model_path
    return demo_model_path("cpu")


def _requirements(extra: str | None) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [r.split(";")[0].replace(" ", "") for r in reqs]


def _runtime_names(reqs: list[str]) -> set[str]:
    import re
    names = {re.split(r"[<>=!~\[]", r, maxsplit=1)[0].lower() for r in reqs}
    return {n for n in names if n in _onnxruntime.DISTRIBUTIONS}


def test_the_base_install_requires_no_onnxruntime_and_each_extra_one():
    assert _runtime_names(_requirements(None)) == set(), "the base install must respect the user's ONNX Runtime"
    assert _runtime_names(_requirements("cpu")) == {"onnxruntime"}
    assert _runtime_names(_requirements("gpu")) == {"onnxruntime-gpu"}
    # The test extra runs GenAI through onnxruntime-genai-cuda, which requires onnxruntime-gpu:
    # plain onnxruntime there would be a second package in the same folder.
    assert _runtime_names(_requirements("test")) == {"onnxruntime-gpu"}
    for extra in ("cpu", "gpu", "test"):
        assert any(r.endswith(">=1.29") for r in _requirements(extra) if r.startswith("onnxruntime")), extra


def test_the_version_matrix_starts_at_the_supported_floor():
    """tools/ort_versions.sh's oldest runtime is the floor the extras require, and the library's
    API version (cpp/custom_op_library.cc refuses older runtimes)."""
    import re
    script = (ROOT / "tools" / "ort_versions.sh").read_text()
    oldest = re.search(r"ORT_FLASH_ORT_OLDEST:-(\d+)\.(\d+)\.0", script)
    too_old = re.search(r"ORT_FLASH_ORT_TOO_OLD:-(\d+)\.(\d+)\.0", script)
    assert oldest and too_old
    for extra in ("cpu", "gpu"):
        assert f"{_requirements(extra)[0].split('>=')[1]}" == f"{oldest[1]}.{oldest[2]}", extra
    assert int(too_old[2]) == int(oldest[2]) - 1
    api = re.search(r"set\(_ort_min_api (\d+)\)", (ROOT / "cmake" / "OrtHeaders.cmake").read_text())
    assert api and int(api[1]) == int(oldest[2])


@pytest.mark.parametrize("dists, importable, expect", [
    ({"onnxruntime-gpu": "1.31.1"}, True, ""),
    ({"onnxruntime": "1.31.1"}, True, ""),
    ({}, True, ""),  # a runtime built from source (no distribution metadata): respected
    ({}, False, "no ONNX Runtime is installed"),
    ({"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"}, True, "onnxruntime 1.31.1 and onnxruntime-gpu 1.31.1"),
])
def test_problem_is_one_line_saying_what_to_do(monkeypatch, dists, importable, expect):
    _fake_installed(monkeypatch, dists, importable)
    message = _onnxruntime.problem()
    if not expect:
        assert message == ""
        return
    assert expect in message and "\n" not in message
    assert "pip install onnxruntime-gpu" in message and "ort-flash[cpu]" in message
    if len(dists) == 2:
        assert "pip uninstall -y onnxruntime onnxruntime-gpu" in message


@pytest.mark.parametrize("dists, importable", [({}, False), ({"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"}, True)])
def test_import_warns_in_one_line(monkeypatch, dists, importable):
    _fake_installed(monkeypatch, dists, importable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.reload(ort_flash)
    said = [w for w in caught if issubclass(w.category, _onnxruntime.OnnxRuntimeWarning)]
    assert len(said) == 1 and str(said[0].message) == _onnxruntime.problem(), caught


def test_import_is_silent_with_one_runtime(monkeypatch):
    _fake_installed(monkeypatch, {"onnxruntime-gpu": "1.31.1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", _onnxruntime.OnnxRuntimeWarning)
        importlib.reload(ort_flash)


def test_installed_reads_the_dist_info_folders_as_importlib_metadata_does():
    from importlib import metadata

    expect = []
    for name in _onnxruntime.DISTRIBUTIONS:
        try:
            expect.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            pass
    assert _onnxruntime.installed() == expect


def test_a_second_package_on_the_path_is_named_at_import(tmp_path):
    """The real lookup: a dist-info folder of the plain package beside the installed GPU one."""
    installed = dict(_onnxruntime.installed())
    if len(installed) != 1:
        pytest.skip(f"this environment has {installed or 'no ONNX Runtime package'}, not one")
    other = "onnxruntime" if "onnxruntime" not in installed else "onnxruntime-gpu"
    info = tmp_path / f"{other.replace('-', '_')}-1.29.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {other}\nVersion: 1.29.0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", "import ort_flash"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    # Pointing at the line that imported ort_flash, the message in one line.
    assert r.stderr.startswith("<string>:1: OnnxRuntimeWarning: ort_flash: "), r.stderr
    assert f"{other} 1.29.0" in r.stderr.splitlines()[0], r.stderr


def test_info_says_it_and_fails_without_a_runtime(monkeypatch, capsys):
    _fake_installed(monkeypatch, {}, importable=False)
    assert cli.main(["info"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("onnxruntime:")]
    assert lines == ["onnxruntime:  PROBLEM: no ONNX Runtime is installed: " + _onnxruntime.INSTALL], out


@pytest.mark.parametrize("command", ["rewrite", "verify", "demo"])
def test_commands_without_a_runtime_say_what_to_install(command, monkeypatch, capsys, tmp_path):
    """rewrite (it checks what it writes in a session), verify and demo need ONNX Runtime: with
    none, the same one line that names what to install (not the exception's type), exit 2, and
    no output file."""
    import onnx
    from onnx import TensorProto, helper

    _fake_installed(monkeypatch, {}, importable=False)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    argv = {"rewrite": ["rewrite", str(tmp_path / "m.onnx"), "-o", str(out)],
            "verify": ["verify", str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx")],
            "demo": ["demo", "--provider", "cpu"]}[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ort-flash: error: " + _onnxruntime.problem()], err
    assert not out.exists()


def test_info_says_it_with_two_runtimes(monkeypatch, capsys):
    _fake_installed(monkeypatch, {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"})
    assert cli.main(["info"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("onnxruntime:")]
    assert len(lines) == 2 and "are installed together" in lines[0], out


def test_session_creation_without_a_runtime_raises_the_line(monkeypatch):
    _fake_installed(monkeypatch, {}, importable=False)
    with pytest.raises(ImportError) as e:
        ort_flash.InferenceSession(_model_path(), providers=CPU_ONLY)
    assert str(e.value) == _onnxruntime.problem()


def test_the_demo_without_a_runtime_is_one_line(monkeypatch, capsys):
    _fake_installed(monkeypatch, {}, importable=False)
    assert cli.main(["demo", "--provider", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "ort-flash: error: " + _onnxruntime.problem()


@pytest.fixture
def cpu_package(monkeypatch):
    """The plain onnxruntime package: no CUDA execution provider."""
    import onnxruntime
    _fake_installed(monkeypatch, {"onnxruntime": "1.31.1"})
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: list(CPU_ONLY))


CUDA_REFUSED = "CUDA was requested, but the installed ONNX Runtime (onnxruntime 1.31.1) has no CUDA execution provider"


def test_a_cuda_session_on_the_cpu_package_is_refused(cpu_package):
    with pytest.raises(RuntimeError, match="CUDA was requested") as e:
        ort_flash.InferenceSession(_model_path(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert CUDA_REFUSED in str(e.value) and "pip install onnxruntime-gpu" in str(e.value)
    assert "\n" not in str(e.value)
    # The default providers take what the package has: CPU, with no refusal.
    assert ort_flash.InferenceSession(_model_path()).get_providers() == CPU_ONLY


def test_demo_and_verify_on_cuda_with_the_cpu_package_are_refused(cpu_package, capsys):
    assert cli.main(["demo", "--provider", "cuda"]) == 2
    assert CUDA_REFUSED in capsys.readouterr().err
    path = _model_path()
    assert cli.main(["verify", path, path, "--provider", "cuda"]) == 2
    assert CUDA_REFUSED in capsys.readouterr().err
