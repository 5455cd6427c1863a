"""Counts of the package's structure, read from its source (nothing is imported or run).

Run ``python tests/structure_counts.py`` from the repository root for the table;
``tests/test_structure.py`` holds the package to the limits these counts are judged by.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "numpyro_dgp"

#: The package's parts from the bottom up: a module may import from its own part and the
#: parts below it, never from a part above (``__version__`` aside: package metadata).
LAYERS = (
    ("kernels",),
    ("core",),
    ("_compat", "_cache"),
    ("_protocol", "_validation"),
    ("likelihoods", "posteriors"),
    ("layers",),
    ("handlers", "guides"),
    ("_engine",),
    ("objectives",),
    ("io",),
    ("infer",),
    ("_predict",),
    ("diagnostics", "models", "sde", "plots", "datasets"),
    ("_saved_model", "recipes"),
    ("cli", "__init__"),
)

#: Imports of another module's ``_`` names, or of another package's private module, that stay,
#: each with its reason.
ALLOWED_PRIVATE_IMPORTS = {
    ("numpyro_dgp/_compat.py", "numpyro_dgp.core._triangular"):
        "NumPyro's lower-Cholesky layout read with the core's gather (not public core API)",
    ("numpyro_dgp/_predict/variants.py", "numpyro_dgp.objectives._collapsed"):
        "the collapsed prediction reuses the collapsed objective's handler",
}


class Import(NamedTuple):
    path: str
    line: int
    module: str
    names: tuple[str, ...]


def package_files() -> list[Path]:
    """The package's Python files, sorted."""
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> list[Import]:
    """Every ``from numpyro_dgp... import ...`` of the package (function-level ones included)."""
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "numpyro_dgp":
                found.append(Import(_rel(path), node.lineno, node.module, tuple(a.name for a in node.names)))
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _package_of(imp: Import) -> str:
    module = _module(ROOT / imp.path)
    return module if imp.path.endswith("__init__.py") else module.rpartition(".")[0]


def private_imports() -> list[Import]:
    """Imports of another module's ``_`` names, and imports that reach into another package's
    private module (``numpyro_dgp.handlers._base`` from outside ``handlers``)."""
    found = []
    for imp in imports():
        private_names = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        owner, _, last = imp.module.rpartition(".")
        package = _package_of(imp)
        reaches_in = imp.module.count(".") >= 2 and last.startswith("_") and not (
            package == owner or package.startswith(owner + "."))
        if private_names or reaches_in:
            found.append(imp)
    return found


def _is_submodule(name: str) -> bool:
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()


def upward_imports() -> list[tuple[Import, str, str]]:
    """Imports from a part above the importing module's part (see :data:`LAYERS`)."""
    level = {part: i for i, parts in enumerate(LAYERS) for part in parts}
    found = []
    for imp in imports():
        source = _part(_module(ROOT / imp.path))
        targets = [imp.module]
        if imp.module == "numpyro_dgp":  # submodules by name, else names of the package's __init__
            targets = [f"numpyro_dgp.{n}" if _is_submodule(n) else "numpyro_dgp" for n in imp.names
                       if n != "__version__"]
        for target in targets:
            part = _part(target)
            if part == source:
                continue
            if level.get(part, len(LAYERS)) > level.get(source, len(LAYERS)):
                found.append((imp, source, part))
    return found


def private_top_level_modules() -> list[str]:
    """The private ``.py`` modules directly in the package (private packages not counted)."""
    return sorted(p.name for p in PACKAGE.glob("_*.py") if p.name != "__init__.py")


def protocol_literals() -> list[str]:
    """``"dgp_`` string literals, and ``msg["args"]`` / ``msg["kwargs"]`` reads of a message,
    outside the message-protocol module."""
    found = []
    pattern = re.compile(r"[\"']dgp_|\bmsg\[\"(args|kwargs)\"\]")
    for path in package_files():
        if path.name == "_protocol.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{_rel(path)}:{number}")
    return found


def _statements(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Statements of a function's body, nested ones included, its docstring not: logical lines,
    which the formatter's wrapping of long calls (an argument a line) does not change."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return sum(isinstance(sub, ast.stmt) for stmt in body for sub in ast.walk(stmt))


def long_functions(limit: int = 40) -> list[tuple[str, int]]:
    """``(file:function, statements)`` of the functions longer than ``limit`` statements."""
    found = []
    for path in package_files():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _statements(node)
                if n > limit:
                    found.append((f"{_rel(path)}:{node.name}", n))
    return sorted(found, key=lambda item: -item[1])


def raises() -> tuple[int, int]:
    """``(raise statements inside check helpers, all raise statements)``; a check helper is a
    function named ``check_*`` / ``_check_*`` or any function of ``_validation.py``."""
    inside, total = 0, 0
    for path in package_files():
        tree = ast.parse(path.read_text())
        in_helper = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    node.name.lstrip("_").startswith("check") or path.name == "_validation.py"):
                in_helper.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Raise))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                total += 1
                inside += id(node) in in_helper
    return inside, total


def lines_over(limit: int = 100) -> int:
    """Lines of the package longer than ``limit`` characters."""
    return sum(len(line) > limit for path in package_files() for line in path.read_text().splitlines())


def code_lines(path: Path) -> int:
    """Physical lines of code of a Python file: lines holding a token that is not a comment, a
    blank or a docstring (of the module, a class or a function)."""
    text = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def files_naming(word: str) -> list[str]:
    """The package files with ``word`` in a code identifier (a name, attribute, argument or
    definition; not strings, comments or docstrings), case-insensitive."""
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            name = (getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "arg", None)
                    or (node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                        else None))
            if isinstance(name, str) and word in name.lower():
                found.append(_rel(path))
                break
    return found


def imports_of(prefix: str) -> list[str]:
    """``file:line`` of every import of a module starting with ``prefix`` (``jax._src``,
    ``threading``)."""
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(m == prefix or m.startswith(prefix + ".") for m in modules):
                found.append(f"{_rel(path)}:{node.lineno}")
    return found


def main() -> None:
    inside, total = raises()
    gp_layer = dict(long_functions(0)).get("numpyro_dgp/layers/__init__.py:gp_layer")
    benchmark_lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "benchmarks").rglob("*.py"))
    readme = ROOT / "benchmarks" / "README.md"
    rows = [
        ("package code lines (no blanks, comments, docstrings)", sum(map(code_lines, package_files()))),
        ("package modules", len(package_files())),
        *[(f"files with '{word}' in a code identifier", len(files_naming(word)))
          for word in ("quadrature", "amortized", "branch", "flow")],
        ("jax._src imports", len(imports_of("jax._src"))),
        ("threading imports", len(imports_of("threading"))),
        ("gp_layer statements", gp_layer),
        ("functions over 40 statements", len(long_functions())),
        ('"dgp_ literals and msg["args"] reads outside _protocol.py', len(protocol_literals())),
        ("private modules at the top level", len(private_top_level_modules())),
        ("imports of another module's _ names or private module", len(private_imports())),
        ("  of them not in the allowed list", len([i for i in private_imports()
                                                   if (i.path, i.module) not in ALLOWED_PRIVATE_IMPORTS])),
        ("imports from a higher layer", len(upward_imports())),
        ("raises in check helpers / all raises", f"{inside} / {total}"),
        ("package lines over 100 characters", lines_over()),
        ("benchmarks/**/*.py lines (scripts, peers, tests)", benchmark_lines),
        ("benchmarks/README.md lines", len(readme.read_text().splitlines()) if readme.exists() else 0),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
