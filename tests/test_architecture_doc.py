"""docs/ARCHITECTURE.md's table of environment variables against the code that reads them.

Every ``ORT_FLASH_*`` name the sources read from the environment (C/C++ ``getenv``, Python
``os.environ`` / ``os.getenv``, CMake ``$ENV{}``, scikit-build-core's ``env =`` in pyproject.toml,
``$NAME`` / ``${NAME...}`` in the shell scripts of tools/ and .ci/) must have a row in the table,
and every row must name a variable something reads, in the files its "read by" cell names.
Text only: no build needed.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SCANNED = ("aot", "cpp", "cmake", "ort_flash", "tools", "models", "tests", ".ci", "CMakeLists.txt",
           "pyproject.toml")
SUFFIXES = {".py", ".cc", ".h", ".inc", ".c", ".cmake", ".txt", ".toml", ".sh"}

NAME = r"(ORT_FLASH_[A-Z0-9_]+)"
READS = (
    re.compile(r"\bgetenv\(\s*[\"']" + NAME),                             # C, C++, os.getenv
    re.compile(r"\benviron(?:\.get|\.pop|\.setdefault)?\s*[\[(]\s*[\"']" + NAME),  # os.environ
    re.compile(r"\bENV\{" + NAME + r"\}"),                                # CMake $ENV{}, DEFINED ENV{}
    re.compile(r"\benv\s*=\s*\"" + NAME + "\""),                          # pyproject.toml
)
SHELL_READ = re.compile(r"\$\{?" + NAME)

# Rows for variables that another branch's code reads, not merged here yet. Each must be read by
# nothing on this branch (else delete it here): empty once that work is merged.
NOT_YET_MERGED: dict[str, str] = {}


def _shell(path: Path, text: str) -> bool:
    return path.suffix == ".sh" or (path.suffix == "" and text.startswith("#!") and "sh" in text.split("\n", 1)[0])


def _sources():
    for entry in SCANNED:
        top = ROOT / entry
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if path == Path(__file__).resolve():
                continue
            if path.suffix not in SUFFIXES and path.suffix != "":
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            yield path, text


def env_reads() -> dict[str, set[str]]:
    """{variable: files that read it} over the sources."""
    found: dict[str, set[str]] = {}
    for path, text in _sources():
        rel = path.relative_to(ROOT).as_posix()
        names = {m for rx in READS for m in rx.findall(text)}
        if _shell(path, text):
            code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
            names |= set(SHELL_READ.findall(code))
        for name in names:
            found.setdefault(name, set()).add(rel)
    return found


def table_rows() -> dict[str, list[str]]:
    """{variable: cells} of the first table under the '## Environment variables' heading."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Environment variables")
    rows: dict[str, list[str]] = {}
    in_table = False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            m = re.fullmatch(r"`" + NAME + "`", cells[0])
            if m:
                rows[m.group(1)] = cells
        elif in_table:
            break
    assert rows, "no table of environment variables under '## Environment variables'"
    return rows


def test_every_variable_read_has_a_row():
    rows = table_rows()
    missing = {name: sorted(files) for name, files in env_reads().items() if name not in rows}
    assert not missing, ("environment variables read by the code with no row in docs/ARCHITECTURE.md's "
                         f"table (add a row: default, meaning, read by): {missing}")


def test_every_row_is_read_where_it_says():
    reads = env_reads()
    for name, cells in table_rows().items():
        if name in NOT_YET_MERGED:
            assert name not in reads, (f"{name} is read now ({sorted(reads[name])}): delete it from "
                                       "NOT_YET_MERGED")
            assert NOT_YET_MERGED[name] in cells[2], f"{name}'s row should say it is {NOT_YET_MERGED[name]}"
            continue
        assert name in reads, f"{name} has a row in docs/ARCHITECTURE.md but nothing reads it (a stale row)"
        named = set(re.findall(r"`([\w./-]+\.(?:py|cc|h|cmake|sh|toml|txt))`", cells[3]))
        assert named, f"{name}'s row names no file in its 'read by' cell"
        for rel in named:
            path = ROOT / rel
            assert path.is_file(), f"{name}'s row names {rel}, which does not exist"
            assert name in path.read_text(encoding="utf-8"), f"{name}'s row names {rel}, which does not mention it"
        assert named & reads[name], (f"{name}'s row names {sorted(named)}, none of which reads it "
                                     f"(read in {sorted(reads[name])})")


def test_not_yet_merged_rows_exist():
    rows = table_rows()
    assert set(NOT_YET_MERGED) <= set(rows), "NOT_YET_MERGED names a variable with no row"
