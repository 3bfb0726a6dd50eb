"""docs/ARCHITECTURE.md against the repository: its table of environment variables against the
code that reads them, and every file path and code symbol it names against the files.

Every ``ORT_FLASH_*`` name the sources read from the environment (C/C++ ``getenv``, Python
``os.environ`` / ``os.getenv``, CMake ``$ENV{}``, scikit-build-core's ``env =`` in pyproject.toml,
``$NAME`` / ``${NAME...}`` in the shell scripts of tools/, lab/ and .ci/) must have a row in the table,
and every row must name a variable something reads, in the files its "read by" cell names.

Every path in backticks outside the fenced drawings must exist, relative to the repository root
(a bare file name: a file of that name, or one the code names, such as a generated file; a
template such as ``cpp/<op>_op.cc``: its folder), and every symbol in backticks (an identifier,
dotted or ``::``-qualified) must occur in the sources or build files. Text only: no build needed.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SCANNED = ("aot", "cpp", "cmake", "ort_flash", "tools", "lab", "tests", ".ci", "CMakeLists.txt",
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


# ---- every file path and code symbol the page names in backticks exists ------------------------

# Where a symbol the page names must occur (as a whole word), read as text: the sources and the
# build files, not the docs, and not this file.
SYMBOL_SOURCES = ("aot", "cpp", "cmake", "ort_flash", "lab", "tools", "tests", "examples",
                  ".ci", "CMakeLists.txt", "pyproject.toml")
SYMBOL_SUFFIXES = {".py", ".h", ".cc", ".c", ".inc", ".cmake", ".txt", ".toml", ".sh", ".lds"}
FILE_SUFFIX = re.compile(r"\.(?:py|cc|h|c|inc|cmake|sh|toml|txt|md|lds|S|json|so(?:\.\d+)?)$")
SYMBOL = re.compile(r"[A-Za-z_][\w*]*(?:(?:\.|::)[A-Za-z_][\w*]*)*(?:\([\w, ]*\))?")
# Prefixes of paths in a build folder (the page's BUILD, or the default build/): build outputs,
# not files of the repository.
BUILD_FOLDERS = ("BUILD/", "build/")


def _inline_code(text: str) -> list[str]:
    """The backtick spans of the page, fenced code blocks left out (they draw, they do not name)."""
    prose, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            prose.append(line)
    return re.findall(r"`([^`\n]+)`", "\n".join(prose))


def _braces(token: str) -> list[str]:
    """``a_{b,c}.cc`` -> ``a_b.cc``, ``a_c.cc``."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", token)
    if not m:
        return [token]
    return [x for part in m.group(1).split(",") for x in _braces(token[:m.start()] + part + token[m.end():])]


def _symbol_text() -> str:
    here = Path(__file__).resolve()
    chunks = []
    for entry in SYMBOL_SOURCES:
        top = ROOT / entry
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix in SYMBOL_SUFFIXES and path != here and "__pycache__" not in path.parts:
                try:
                    chunks.append(path.read_text(encoding="utf-8"))
                except (UnicodeDecodeError, OSError):
                    pass
    return "\n".join(chunks)


def _repo_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for entry in SYMBOL_SOURCES + ("docs",)
            for p in ([ROOT / entry] if (ROOT / entry).is_file() else (ROOT / entry).rglob("*"))}


def _word(name: str) -> re.Pattern:
    """A whole-word match of ``name``; ``*`` stands for any identifier characters."""
    return re.compile(r"(?<!\w)" + r"\w*".join(re.escape(p) for p in name.split("*")) + r"(?!\w)")


def _path_problem(token: str, files: set[str], text: str) -> str | None:
    if token.startswith(("$", "~", "http")):
        return None  # a location outside the repository, from the environment
    if token.startswith(BUILD_FOLDERS):  # a build output: its name must be what the build writes
        name = token.rstrip("/").rsplit("/", 1)[-1]
        return None if _word(name).search(text) else f"{token}: no source writes {name}"
    rel = token.rstrip("/")
    if token.endswith("/") and "/" not in rel:  # a folder: named from the repository root
        return None if (ROOT / rel).is_dir() else f"{token}: no such folder (paths are relative to the repository root)"
    if "<" in rel:  # a template (`cpp/<op>_op.cc`): the folder it goes in must exist
        folder = rel[:rel.index("<")].rpartition("/")[0]
        return None if (ROOT / folder).is_dir() else f"{token}: no folder {folder}"
    if "/" in rel:
        if "*" in rel:
            rx = re.compile(re.escape(rel).replace(r"\*", r"[^/]*"))
            return None if any(rx.fullmatch(f) for f in files) else f"{token}: no file matches"
        return None if (ROOT / rel).exists() else f"{token}: no such file or folder (paths are relative to the repository root)"
    # A bare file name: a file of that name somewhere, or one the code names (a generated file,
    # a system library).
    rx = re.compile(re.escape(rel).replace(r"\*", r"[^/]*"))
    if any(rx.fullmatch(f.rsplit("/", 1)[-1]) for f in files) or _word(rel).search(text):
        return None
    return f"{token}: no file of that name, and no source names it"


def doc_names() -> tuple[list[str], list[str]]:
    """(paths, symbols) the page names in backticks: a span with a slash or a file suffix is a
    path (a span with spaces, a command, contributes its path-like words); a span that reads as
    an identifier, dotted or ``::``-qualified, with or without a call's ``()``, is a symbol;
    anything else (values, commands, expressions) names neither."""
    paths, symbols = [], []
    for span in _inline_code(DOC.read_text(encoding="utf-8")):
        words = span.split()
        for word in words:
            for token in _braces(word.strip(",;:()")):
                if "/" in token or FILE_SUFFIX.search(token):
                    paths.append(token)
                elif len(words) == 1 and SYMBOL.fullmatch(token):
                    symbols.append(token)
    return paths, symbols


def test_every_path_the_page_names_exists():
    files, text = _repo_files(), _symbol_text()
    problems = sorted({p for p in (_path_problem(t, files, text) for t in doc_names()[0]) if p})
    assert not problems, "docs/ARCHITECTURE.md names paths that do not exist:\n" + "\n".join(problems)


def test_every_symbol_the_page_names_exists():
    text = _symbol_text()
    missing = set()
    for symbol in doc_names()[1]:
        for part in re.split(r"\.|::", re.sub(r"\(.*\)$", "", symbol)):
            if not _word(part).search(text):
                missing.add(f"{symbol} ({part})" if part != symbol else symbol)
    assert not missing, ("docs/ARCHITECTURE.md names symbols that no source file (.py, .h, .cc, "
                         "build files) holds: " + ", ".join(sorted(missing)))
