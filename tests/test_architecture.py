"""The structure ARCHITECTURE.md draws, checked on the source so that it stays true.

Every import of every module of `audit` is read from its syntax tree (those inside functions
and under `if TYPE_CHECKING:` too), so a lazy import counts like any other.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "audit"
# The presentation: the only modules that may draw on a terminal.
PRESENTATION = ("audit.cli", "audit.tui", "audit.__main__")
# ARCHITECTURE.md's layers, top to bottom, each a top-level part of the package (a folder, or
# the modules at the root): a module imports only its own layer and those below. `ls audit/`
# shows them; a new module goes into the folder of its layer, and nothing else needs saying.
LAYERS = {
    "presentation": ("cli", "tui", "__main__"),
    "public API": ("api",),
    "flows": ("flows",),
    "generator": ("generate",),
    "outputs": ("report",),
    "engine": ("engine",),
    "rules": ("checks",),
    "record view": ("records",),
    "model facts": ("model",),
    "base": ("base", ""),  # "": audit/__init__.py, the public names, loaded lazily
}
UI_LIBRARIES = ("rich", "typer", "textual")
# audit.checks beside the rules: the rule set that selects and configures them, and the verdict.
RULE_SET_MODULES = ("audit.checks.ruleset", "audit.checks.verdict")
MAX_MODULE_LINES = 400
RULE_CODE = re.compile(r"^[A-Z]{3}\d{3}$")


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


@cache
def imports(name: str) -> frozenset[str]:
    """What module `name` imports: dotted names, a package's submodule where one is named."""
    tree = ast.parse(modules()[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if _is_package(name) else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules() else base)
    return frozenset(found)


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in packages)


def part_of(name: str) -> str:
    """The top-level part of the package a module belongs to: `audit.model.tokens.tokenizer` -> `model`."""
    return name.split(".")[1] if "." in name else ""


def layer_of(name: str) -> int | None:
    """The index in LAYERS (0 the top) of the module `name`: its top-level part's layer."""
    part = part_of(name)
    return next((index for index, parts in enumerate(LAYERS.values()) if part in parts), None)


def test_every_module_has_its_layer() -> None:
    assert [name for name in modules() if layer_of(name) is None] == []


def test_the_package_root_holds_the_layers_folders_only() -> None:
    """`ls audit/` reads as the architecture: a folder a layer, and the three root modules."""
    entries = {path.name for path in PACKAGE.iterdir() if path.name != "__pycache__"}
    folders = {part for parts in LAYERS.values() for part in parts if part and part not in ("api", "__main__")}
    assert entries == folders | {"__init__.py", "__main__.py", "api.py"}
    assert all((PACKAGE / folder / "__init__.py").is_file() for folder in folders)


# audit/model/'s concerns: `ls audit/model/` is its map (ARCHITECTURE.md's `model/` row).
MODEL_CONCERNS = ("families", "calls", "rendering", "encoders", "tokens", "trainers")


def test_the_model_layer_holds_its_concerns_folders_only() -> None:
    """A model module goes into the folder of its concern, never beside them."""
    model = PACKAGE / "model"
    entries = {path.name for path in model.iterdir() if path.name != "__pycache__"}
    assert entries == {"__init__.py", *MODEL_CONCERNS}
    assert all((model / concern / "__init__.py").is_file() for concern in MODEL_CONCERNS)


def test_every_module_says_what_it_owns_in_its_first_line() -> None:
    missing = [
        name for name, path in modules().items()
        if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    ]
    assert missing == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    names = list(LAYERS)
    upward = [
        f"{name} ({names[layer_of(name)]}) imports {other} ({names[layer_of(other)]})"
        for name in modules()
        for other in sorted(imports(name))
        if other in modules()
        and layer_of(other) is not None
        and layer_of(name) is not None
        and layer_of(other) < layer_of(name)
    ]
    assert upward == []


def test_only_the_presentation_imports_rich_typer_and_textual() -> None:
    offenders = {
        name: sorted(i for i in imports(name) if _in(i, UI_LIBRARIES))
        for name in modules()
        if not _in(name, PRESENTATION)
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_core_never_imports_the_presentation() -> None:
    offenders = {
        name: sorted(i for i in imports(name) if _in(i, PRESENTATION))
        for name in modules()
        if not _in(name, PRESENTATION)
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over the package's import graph: all single."""
    graph = {
        name: sorted(i for i in imports(name) if i in modules() and i != name) for name in modules()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for name in graph:
            if name not in index:
                visit(name)
    finally:  # the process's limit is other tests' too (how deep Python's json reads)
        sys.setrecursionlimit(limit)
    assert cycles == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_over_400_lines(name: str) -> None:
    lines = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines; split it by concern"


# What the engine may take from audit.checks: the rule set it runs, its verdicts, and the code
# it reports a raising rule under. Never a rule's own module.
ENGINE_MAY_IMPORT = ("audit.checks.ruleset", "audit.checks.verdict", "audit.checks.internal")


def test_the_engine_does_not_reach_into_rules() -> None:
    """The engine runs rules through the rule set; what a rule computes stays the rule's."""
    engine = [name for name in modules() if _in(name, ("audit.engine.runner",))]
    reached = sorted(
        i for name in engine for i in imports(name) if _in(i, ("audit.checks",)) and i not in ENGINE_MAY_IMPORT
    )
    assert engine and reached == []


def test_a_rule_module_imports_no_other_rule_module() -> None:
    """Shared grammar and id-list helpers live in core modules, not in another rule's module."""
    rule_modules = [
        n for n in modules() if n.startswith("audit.checks.") and n not in ("audit.checks.base", *RULE_SET_MODULES)
    ]
    offenders = {
        name: sorted(
            i for i in imports(name) if _in(i, ("audit.checks",)) and i != "audit.checks.base"
        )
        for name in rule_modules
    }
    assert rule_modules and {name: found for name, found in offenders.items() if found} == {}


@pytest.mark.parametrize(
    "name",
    ["audit.records.reader", "audit.records.line_reading", "audit.records.contract", "audit.records.sources", "audit.engine.runner"],
)
def test_the_reader_and_the_contract_name_no_rule_code(name: str) -> None:
    """They name kinds of problem; each rule says which kind it reports (`Rule.problem`)."""
    tree = ast.parse(modules()[name].read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    codes = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and any(RULE_CODE.match(word) for word in re.findall(r"\w+", node.value))
    ]
    assert codes == []


def test_importing_audit_loads_nothing_heavy() -> None:
    """`import audit` is cheap: the public names load their modules on first use."""
    probe = (
        "import sys, audit\n"
        "heavy = {'polars', 'pandera', 'transformers', 'tokenizers', 'rich', 'typer', 'textual',"
        " 'numpy'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
        "print(sorted(m for m in sys.modules if m.startswith('audit.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.splitlines() == ["[]", "[]"]


def test_the_public_surface_is_all_there() -> None:
    import audit

    missing = [name for name in audit.__all__ if not hasattr(audit, name)]
    assert missing == [] and {"check_target", "gate", "export", "draft_vocab"} <= set(audit.__all__)
    assert set(audit.__all__) <= set(dir(audit))
