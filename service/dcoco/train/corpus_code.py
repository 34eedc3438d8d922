"""Code and prose records from Python's own standard library, which every machine has.

Code: each function or method becomes a request (its signature and docstring summary, or the
signature and docstring to complete, or just its name) answered by its source. Prose: module,
class and function docstrings become "what does X do?" answers.
"""

import ast
import inspect
import random
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

from dcoco.train.corpus import Record

SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "ensurepip"}
    | {"turtledemo", "tkinter", "__pycache__", "__phello__"}
)
MIN_PROSE_CHARS = 120  # shorter docstrings are one-line summaries, not prose


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, test suites and GUI demos left out, in sorted order."""
    base = root or Path(sysconfig.get_paths()["stdlib"])
    return _sources(base, base)


def package_files(names: tuple[str, ...], root: Path | None = None) -> list[Path]:
    """The .py files of the installed packages `names` (import names, in that order), picked as
    `stdlib_files` picks them; their module names are relative to `root`, the site-packages."""
    base = root or Path(sysconfig.get_paths()["purelib"])
    return [path for name in names for path in _sources(base / name, base)]


def _sources(folder: Path, root: Path) -> list[Path]:
    return [
        path
        for path in sorted(folder.rglob("*.py"))
        if not SKIP_DIRS & set(path.relative_to(root).parts[:-1])
        and not path.name.startswith("test_")
    ]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def records_from_file(
    path: Path, root: Path, max_chars: int, rng: random.Random
) -> Iterator[Record]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = source.splitlines()
    module = module_name(path, root)
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= MIN_PROSE_CHARS:
        yield Record("prose", module, f"What does the Python module `{module}` do?", doc)
    for node, qualname in _definitions(tree):
        key = f"{module}:{qualname}"
        doc = ast.get_docstring(node)
        if isinstance(node, ast.ClassDef):
            if doc and len(doc) >= MIN_PROSE_CHARS:
                yield Record("prose", key, f"Describe the class `{qualname}` in `{module}`.", doc)
            continue
        body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
        if node.decorator_list or len(body) > max_chars or body.count("\n") < 1:
            continue
        yield Record("code", key, _code_request(node, body, module, doc, rng), body)
        if doc and len(doc) >= MIN_PROSE_CHARS:
            yield Record("prose", key, f"Explain what `{module}.{qualname}` does.", doc)


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _definitions(tree: ast.Module) -> Iterator[tuple[Definition, str]]:
    """Top-level functions and classes, and the methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node, node.name
        elif isinstance(node, ast.ClassDef):
            yield node, node.name
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield inner, f"{node.name}.{inner.name}"


def _code_request(
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    body: str,
    module: str,
    doc: str | None,
    rng: random.Random,
) -> str:
    """One of three phrasings, so the model sees requests shaped like HumanEval's and others."""
    signature = f"{node.name}({ast.unparse(node.args)})"
    if not doc:
        return f"Write the Python function `{signature}` from the `{module}` module."
    summary = inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ")
    if rng.random() < 0.5:
        return f"Write a Python function `{signature}`: {summary}"
    header = "\n".join(body.splitlines()[: node.body[0].lineno - node.lineno])
    quoted = textwrap.indent(inspect.cleandoc(doc), "    ")
    return f'Complete this Python function:\n\n{header}\n    """\n{quoted}\n    """\n'
