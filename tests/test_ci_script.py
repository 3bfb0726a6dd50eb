"""The CI job (.ci/run) runs the README's test command, and a failing step of it ends the job.

The test command is an && list; under `set -e` bash does not stop at a failure inside one, so
without its `|| exit` guard a failed venv or pip step went on to the sanitizer job under whatever
Python was on PATH (a CI run failed so, far from its cause, on `import ml_dtypes`).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```\n(.*?)```", section, re.S)]


def test_the_quick_start_has_two_commands_and_ci_runs_the_test_one():
    commands = _quick_start_commands()
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo.endswith("ort-flash demo") and "\n" not in demo
    assert "&& python -m pytest" in tests and "\n" not in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.replace(" \\\n", " "), "the README's test command is not what .ci/run runs"


# The jobs .ci/run starts after the test command, in order (tools/*.sh, stubbed in the scratch tree).
JOBS = ("sanitize", "build_wheel", "check_wheel", "check_wheel_suites", "ort_versions", "build_archive")


def test_ci_runs_the_readme_deploy_commands():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh deploy\n(.*?)```", text, re.S)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert commands, "the README has no deploy block"
    ci = (ROOT / ".ci" / "run").read_text()
    for command in commands:
        assert command in ci, f"CI does not run the README's deploy command {command!r}"


def _run_scratch_ci(tmp_path: Path, failing: str | None) -> subprocess.CompletedProcess:
    """.ci/run copied into a scratch tree whose python3, pip and python are stubs (the venv step
    writes a .venv/bin/activate that puts them first on PATH; `failing` names the step whose
    stub exits 3) and whose later jobs (JOBS) each append their name and the Python they were
    given to `jobs-ran`."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "tools").mkdir()
    for job in JOBS:
        (tmp_path / "tools" / f"{job}.sh").write_text(f'echo "{job} $PYTHON" >> {tmp_path}/jobs-ran\n')
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    end = {s: ("exit 3" if s == failing else "exit 0") for s in ("venv", "pip", "pytest")}
    (stubs / "python3").write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  printf 'export VIRTUAL_ENV=%s/%s\\nexport PATH=%s:$PATH\\n' "$PWD" "$3" "{stubs}" > "$3/bin/activate"
  {end["venv"]}
fi
echo "Python 3 (stub)"
""")
    (stubs / "pip").write_text(f"#!/usr/bin/env bash\n{end['pip']}\n")
    (stubs / "python").write_text(f"#!/usr/bin/env bash\n{end['pytest']}\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}")
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("failing", ["venv", "pip", "pytest"])
def test_a_failing_step_ends_the_ci_job_before_the_sanitizer_job(tmp_path, failing):
    r = _run_scratch_ci(tmp_path, failing)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "the README's test command failed (exit 3)" in r.stdout
    assert not (tmp_path / "jobs-ran").exists(), "a later job ran after a failed step"


def test_the_ci_job_runs_the_later_jobs_with_the_venv_python_when_every_step_passes(tmp_path):
    r = _run_scratch_ci(tmp_path, None)
    assert r.returncode == 0, (r.stdout, r.stderr)
    ran = tmp_path / "jobs-ran"
    assert ran.exists()
    assert ran.read_text().splitlines() == [f"{job} {tmp_path}/.venv/bin/python" for job in JOBS]
