"""The imports between ort_flash's modules run one way, and no source file is long.

The import graph is read from the sources with ast, nothing is imported: every ``import`` and
``from ... import`` of a module, at module level or inside a function, class or ``if``, is an
edge to the ort_flash module it names (``from ort_flash.x import y`` names the submodule
``ort_flash.x.y`` where there is one, else ``ort_flash.x``; a package is its ``__init__.py``).
Python also runs a package's ``__init__`` before any of its submodules; that step is the
language's, not the code's, and is no edge.

The layers of docs/ARCHITECTURE.md ("Layers: what each part may import"), lowest first (FLOORS):
a module may import its own layer and those below it, never one above. Inside the rewriter its
parts (REWRITER_ROOMS) run the same way: the pipeline over fusions and refinements, refinements
over the mask prover, all over the helper modules.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ort_flash"

# Lowest first. A module's floor is that of the longest prefix that names it.
FLOORS = (
    # the library's location and SessionOptions, the installed ONNX Runtime, the GPU: what the
    # rewriter's output check and the session helpers share
    ("ground", ("ort_flash._library", "ort_flash._onnxruntime", "ort_flash._cuda_device")),
    ("rewriter", ("ort_flash.rewriter",)),
    # the package's API and everything else of ort_flash/: sessions, verify, demo, info, genai, ...
    ("runtime", ("ort_flash",)),
    ("bench", ("ort_flash.bench",)),
    ("cli", ("ort_flash.cli",)),
)
# Compiled modules (no source here); they import nothing of ort_flash.
EXTENSIONS = {"ort_flash._C"}

# The rewriter's rooms, and the rooms each may import (its own included).
REWRITER_ROOMS = {
    "pipeline": ("ort_flash.rewriter.pipeline",),
    "fusions": ("ort_flash.rewriter.fusions",),
    "refinements": ("ort_flash.rewriter.refinements",),
    "mask_prover": ("ort_flash.rewriter.mask_prover",),
    "helpers": ("ort_flash.rewriter",),  # the other modules: shapes, subgraphs, model_io, report, ...
}
MAY_IMPORT = {
    "pipeline": {"pipeline", "fusions", "refinements", "mask_prover", "helpers"},
    "fusions": {"fusions", "helpers"},
    "refinements": {"refinements", "mask_prover", "helpers"},
    "mask_prover": {"mask_prover", "helpers"},
    "helpers": {"helpers"},
}
# ort_flash/rewriter/__init__.py re-exports the public names: like the pipeline, it sees every room.
REWRITER_API = "ort_flash.rewriter"

MAX_LINES = 500
LONG_SOURCES = ("aot", "cpp", "ort_flash")
SOURCE_SUFFIXES = {".py", ".c", ".cc", ".cpp", ".h", ".hpp", ".inc", ".cu", ".cuh"}
LONG_ALLOWED = {
    "cpp/cpu_flash_kernel.inc",  # the CPU kernel's tile code, compiled once per ISA
}


def modules() -> dict[str, Path]:
    """{dotted name: path} of every module in ort_flash/ (a package by its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _base(module: str, path: Path, level: int) -> str:
    """The package a relative import of ``level`` dots in ``module`` starts from."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The ort_flash modules that ``module`` imports anywhere in its source."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = _base(module, path, node.level) + (f".{source}" if source else "")
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in known | EXTENSIONS else source
                     for a in node.names]
        else:
            continue
        for name in names:
            if name == "ort_flash" or name.startswith("ort_flash."):
                while name not in known | EXTENSIONS:  # `import ort_flash.x.y` of a module x.y
                    name = name.rpartition(".")[0]
                if name not in EXTENSIONS:
                    out.add(name)
    out.discard(module)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports(m, p, set(found)) for m, p in found.items()}


def _place(module: str, table) -> str:
    """The name of the entry of ``table`` ((name, prefixes) pairs) whose prefix names
    ``module`` most closely."""
    best, length = None, -1
    for name, prefixes in table:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = name, len(prefix)
    assert best is not None, module
    return best


def floor(module: str) -> int:
    names = [name for name, _ in FLOORS]
    return names.index(_place(module, FLOORS))


def room(module: str) -> str:
    return _place(module, REWRITER_ROOMS.items())


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    """The reader sees what it must (else the tests below would pass on an empty graph)."""
    edges = graph()
    assert "ort_flash._library" in edges["ort_flash.rewriter.output_check"]
    assert "ort_flash.rewriter.pipeline" in edges["ort_flash.rewriter"]
    assert "ort_flash.rewriter" in edges["ort_flash"]  # inside __getattr__, by a relative import
    assert "ort_flash.bench.results" in edges["ort_flash.cli.bench_command"]
    assert "ort_flash.cli.main" in edges["ort_flash.cli"]


def test_the_reader_resolves_relative_and_function_level_imports(tmp_path):
    package = tmp_path / "ort_flash"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import sub\nfrom ._C import x\n")
    (package / "sub" / "__init__.py").write_text("def f():\n    from ..sub import leaf\n")
    (package / "sub" / "leaf.py").write_text("import ort_flash.sub.leaf\nfrom .. import sub\n")
    known = {"ort_flash", "ort_flash.sub", "ort_flash.sub.leaf"}
    assert imports("ort_flash", package / "__init__.py", known) == {"ort_flash.sub"}
    assert imports("ort_flash.sub", package / "sub" / "__init__.py", known) == {"ort_flash.sub.leaf"}
    assert imports("ort_flash.sub.leaf", package / "sub" / "leaf.py", known) == {"ort_flash.sub"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, f"import cycles between ort_flash's modules: {found}"


def test_imports_run_down_the_floors():
    names = [name for name, _ in FLOORS]
    up = sorted(f"{m} ({names[floor(m)]}) imports {t} ({names[floor(t)]})"
                for m, targets in graph().items() for t in targets if floor(t) > floor(m))
    assert not up, "imports up a floor (docs/ARCHITECTURE.md, the rooms):\n" + "\n".join(up)


def test_the_rewriter_imports_nothing_above_it():
    """The rewriter's modules import only each other and the ground floor: never the package's
    API, the sessions, verify, bench or the CLI."""
    ground = {m for m in graph() if floor(m) == 0}
    up = sorted(f"{m} imports {t}" for m, targets in graph().items() if m.startswith("ort_flash.rewriter")
                for t in targets if not t.startswith("ort_flash.rewriter") and t not in ground)
    assert not up, "\n".join(up)


def test_the_rewriter_rooms_run_one_way():
    bad = []
    for module, targets in graph().items():
        if not module.startswith("ort_flash.rewriter") or module == REWRITER_API:
            continue
        for target in targets:
            if target.startswith("ort_flash.rewriter") and room(target) not in MAY_IMPORT[room(module)]:
                bad.append(f"{module} ({room(module)}) imports {target} ({room(target)})")
    assert not bad, "\n".join(sorted(bad))


def test_no_source_file_is_longer_than_500_lines():
    long = {}
    for top in LONG_SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file() or "__pycache__" in rel:
                continue
            lines = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
            if lines > MAX_LINES and rel not in LONG_ALLOWED:
                long[rel] = lines
    assert not long, f"source files over {MAX_LINES} lines (split them by role): {long}"


def test_the_long_exceptions_still_exist():
    """An exception for a file that is gone or short again is stale: delete it."""
    for rel in LONG_ALLOWED:
        path = ROOT / rel
        assert path.is_file(), f"{rel} is gone: delete it from LONG_ALLOWED"
        assert len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES, (
            f"{rel} is {MAX_LINES} lines or fewer now: delete it from LONG_ALLOWED")


# The developer area and the project's scripts: the product (ort_flash/, aot/) never loads them,
# by an import or by a path in its code (a string that starts with one of these folders, or the bare
# name of the developer area). Docstrings and comments may name them.
OUTSIDE_THE_PRODUCT = ("lab", "tests", "tools", "experiments", "models")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def product_reaches_outside(text: str) -> list[str]:
    """Imports of, and code strings naming, a folder of OUTSIDE_THE_PRODUCT in one source."""
    tree = ast.parse(text)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            parts = node.value.replace("\\", "/").split("/")
            if len(parts) > 1 and parts[0] in OUTSIDE_THE_PRODUCT or node.value == "lab":
                found.append(f"line {node.lineno}: the path {node.value!r}")
            continue
        else:
            continue
        found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in OUTSIDE_THE_PRODUCT]
    return found


def test_the_product_never_reaches_into_the_lab():
    """ort_flash/ and aot/ are what ships and builds; lab/ (experiments, the tests' model builders,
    the GPU release check), tools/ and tests/ use them, never the other way (lab/README.md)."""
    bad = [f"{p.relative_to(ROOT)} {what}" for top in ("ort_flash", "aot") for p in sorted((ROOT / top).rglob("*.py"))
           for what in product_reaches_outside(p.read_text(encoding="utf-8"))]
    assert not bad, "the product reaches outside itself:\n" + "\n".join(bad)


def test_the_outside_check_sees_imports_and_paths():
    assert product_reaches_outside('"""see lab/models/x.py"""\nimport os\n') == []
    assert product_reaches_outside("from lab.models import families\n") == ["line 1: import lab.models"]
    assert product_reaches_outside("import tools.sass_hashes\n") == ["line 1: import tools.sass_hashes"]
    assert product_reaches_outside("p = ROOT / 'lab'\n") == ["line 1: the path 'lab'"]
    assert product_reaches_outside("p = 'models/big_model.py'\n") == ["line 1: the path 'models/big_model.py'"]
