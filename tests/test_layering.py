"""Imports run one way: every module under service/dcoco, parsed with `ast`, imports only the
parts of dcoco its part may import (the table below, which the README's layout section spells
out), and the torch-free parts never load torch."""

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SOURCE = ROOT / "service" / "dcoco"

# The parts of dcoco (a package or a top-level module) and the other parts each may import at
# module level. Cross-links between applications are named: eval reads prompt files as
# `dcoco generate` does; the serving benchmark starts the stack the way `dcoco serve` does.
LAYERS: dict[str, set[str]] = {
    "shared": set(),
    "paths": set(),
    "logs": set(),
    "tokenizer": set(),
    "model": set(),
    "queue": set(),
    "suites": {"shared"},
    "spec": {"model", "shared"},
    "checkpoint": {"model", "spec"},
    "precision": {"model", "shared"},
    "engine": {"checkpoint", "model", "precision", "shared", "spec"},
    # The vLLM engine is a sibling of the embedded one behind the same protocol: what both
    # need lives below them, never in `engine`.
    "vllm": {
        "checkpoint",
        "model",
        "paths",
        "precision",
        "settings",
        "shared",
        "spec",
        "tokenizer",
    },
    "settings": {"paths", "shared"},
    "gateway": {"queue", "settings", "shared", "tokenizer"},
    "worker": {"queue", "settings", "shared", "tokenizer"},
    "serve": {"paths", "shared"},
    "generate": {"checkpoint", "engine", "settings", "shared", "tokenizer"},
    # train reads the evaluation suites to keep them out of its data.
    "train": {
        "checkpoint",
        "engine",
        "model",
        "paths",
        "precision",
        "shared",
        "spec",
        "suites",
        "tokenizer",
    },
    "eval": {
        "checkpoint",
        "engine",
        "model",
        "paths",
        "precision",
        "shared",
        "spec",
        "suites",
        "tokenizer",
    },
    "bench": {
        "checkpoint",
        "engine",
        "gateway",
        "model",
        "paths",
        "precision",
        "queue",
        "serve",
        "settings",
        "shared",
        "spec",
        "suites",
        "tokenizer",
        "vllm",
        "worker",
    },
    "commands": {"paths", "shared"},
    "cli": {"commands", "shared"},
    "__main__": {"cli"},
}
# Imports allowed only inside functions, so that importing the module stays light: the worker
# picks its engine in one module, and each command imports what it runs when it runs.
LAZY: dict[str, set[str]] = {
    "worker.engines": {"engine", "vllm"},
    **{
        f"commands.{path.stem}": set(LAYERS) - {"cli", "commands", "__main__"}
        for path in (SOURCE / "commands").glob("*.py")
    },
}
# The parts that run without torch (the gateway's image has none) and what else they may use
# beyond the standard library.
TORCH_FREE = {
    "shared",
    "suites",
    "paths",
    "logs",
    "tokenizer",
    "queue",
    "settings",
    "gateway",
    "worker",
    "serve",
    "commands",
    "cli",
}
HEAVY = {"torch", "vllm", "transformers", "safetensors", "numpy"}
SHARED_THIRD_PARTY = {"pydantic", "redis"}  # redis-py for its backoff, nothing else
NOT_PRODUCTION = {"bench", "commands", "cli", "__main__"}


@dataclass(frozen=True)
class Import:
    module: str  # the dotted name imported, absolute
    line: int
    lazy: bool  # inside a function


def imports_of(path: Path) -> list[Import]:
    """Every import statement, and every `importlib.import_module` of a literal (or f-string
    with a literal start) name, as the absolute module it names."""
    package = ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts[:-1])
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, child.lineno, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                names = [f"{base}.{a.name}" for a in child.names] if base == "dcoco" else [base]
                found.extend(Import(name, child.lineno, inner) for name in names)
            elif isinstance(child, ast.Call) and _is_import_module(child) and child.args:
                name = _literal_start(child.args[0])
                if name:
                    found.append(Import(name.rstrip("."), child.lineno, inner))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), lazy=False)
    return found


def _is_import_module(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )


def _literal_start(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def module_name(path: Path) -> str:
    """`dcoco.gateway.app` -> "gateway.app"; a package's `__init__` is the package."""
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(dotted: str) -> str:
    """The part of dcoco a name relative to `dcoco` belongs to: "gateway.app" -> "gateway"."""
    return dotted.split(".")[0]


MODULES = {module_name(p): imports_of(p) for p in sorted(SOURCE.rglob("*.py"))}


def dcoco_imports(module: str) -> list[tuple[str, Import]]:
    """(part imported, import) for each import of another part of dcoco."""
    own = part_of(module)
    found = []
    for imported in MODULES[module]:
        if imported.module.startswith("dcoco."):
            target = part_of(imported.module.removeprefix("dcoco."))
            if target != own:
                found.append((target, imported))
    return found


def test_every_module_belongs_to_a_part_in_the_table() -> None:
    parts = {part_of(m) for m in MODULES if m}
    assert parts <= set(LAYERS), f"add these to LAYERS: {sorted(parts - set(LAYERS))}"


def test_the_table_runs_one_way() -> None:
    """No cycle among the parts: a depth-first walk never meets a part it is inside."""
    done: set[str] = set()

    def walk(part: str, path: tuple[str, ...]) -> None:
        assert part not in path, f"import cycle: {' -> '.join((*path, part))}"
        if part not in done:
            for lower in LAYERS[part]:
                walk(lower, (*path, part))
            done.add(part)

    for part in LAYERS:
        walk(part, ())


@pytest.mark.parametrize("module", [m for m in MODULES if m])
def test_imports_follow_the_layers(module: str) -> None:
    allowed = LAYERS[part_of(module)]
    lazy_allowed = LAZY.get(module, set())
    wrong = [
        f"line {i.line}: {i.module}" + (" (inside a function)" if i.lazy else "")
        for target, i in dcoco_imports(module)
        if target not in allowed and not (i.lazy and target in lazy_allowed)
    ]
    assert not wrong, f"dcoco.{module} may import only {sorted(allowed)}: {wrong}"


@pytest.mark.parametrize("module", [m for m in MODULES if part_of(m) in TORCH_FREE])
def test_torch_free_parts_import_nothing_heavy_at_module_level(module: str) -> None:
    heavy = [
        f"line {i.line}: {i.module}"
        for i in MODULES[module]
        if not i.lazy and i.module.split(".")[0] in HEAVY
    ]
    assert not heavy, f"dcoco.{module}: {heavy}"


@pytest.mark.parametrize("module", [m for m in MODULES if part_of(m) == "shared"])
def test_shared_uses_only_the_standard_library_pydantic_and_redis(module: str) -> None:
    third_party = {
        i.module.split(".")[0]
        for i in MODULES[module]
        if i.module.split(".")[0] not in sys.stdlib_module_names | {"dcoco"}
    }
    assert third_party <= SHARED_THIRD_PARTY, f"dcoco.{module}: {sorted(third_party)}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("commands.")])
def test_commands_import_heavy_modules_only_inside_functions(module: str) -> None:
    """At module level a command imports the standard library and the light parts only, so
    that building the parser loads nothing it does not need."""
    eager = [
        f"line {i.line}: {i.module}"
        for i in MODULES[module]
        if not i.lazy
        and i.module.split(".")[0] not in sys.stdlib_module_names
        and not (
            i.module.startswith("dcoco.")
            and part_of(i.module.removeprefix("dcoco.")) in {"commands", *LAYERS["commands"]}
        )
    ]
    assert not eager, f"dcoco.{module}: {eager}"


def test_production_code_never_imports_bench_commands_or_cli() -> None:
    """Nor does anything but the CLI import the commands."""
    wrong = [
        f"dcoco.{module} line {i.line}: {i.module}"
        for module in MODULES
        if part_of(module) not in NOT_PRODUCTION
        for target, i in dcoco_imports(module)
        if target in NOT_PRODUCTION
    ]
    assert not wrong
    importers = {part for part, lower in LAYERS.items() if "commands" in lower}
    assert importers == {"cli"}


def test_nothing_but_the_worker_s_engine_module_imports_vllm() -> None:
    """Besides `worker/engines.py` (inside functions) and the benchmarks, dcoco.vllm is reached
    only through vLLM's plugin entry point (pyproject.toml) and the commands."""
    importers = {
        module
        for module in MODULES
        for target, i in dcoco_imports(module)
        if target == "vllm" and part_of(module) not in {"bench", "commands"}
    }
    assert importers <= {"worker.engines"}
    assert {part for part, lower in LAYERS.items() if "vllm" in lower} == {"bench"}


def test_the_readme_states_the_same_layers() -> None:
    """Each part has a line `- `dcoco.<part>`: a, b, c (notes)` in the README's layout section,
    naming exactly what the table allows."""
    readme = (ROOT / "README.md").read_text()
    rules = dict(re.findall(r"^- `dcoco\.(\S+)`: (.+)$", readme, flags=re.MULTILINE))
    for part, allowed in LAYERS.items():
        assert part in rules, f"the README has no layering rule for dcoco.{part}"
        named = re.split(r" \(|;", rules[part])[0]
        listed = set() if named.startswith("nothing") else set(named.split(", "))
        assert listed == allowed, f"dcoco.{part}: the README says {named!r}"


def test_the_torch_free_parts_load_no_torch() -> None:
    """Importing every module of the gateway, the queue, the settings, the shared layer and the
    other torch-free parts, in a fresh interpreter, loads none of the heavy packages."""
    modules = sorted(f"dcoco.{m}" for m in MODULES if m and part_of(m) in TORCH_FREE)
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"loaded = sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
