"""The layers, read off the import graph of the source files (every import, top level or in a function).

- sharding_lab outside `engine/` is torch-free; the CLI layer (`cli.py`, `labs/commands.py`,
  `estimate.py`) reaches the engine only from inside the command that runs it.
- studyapp reaches only torch-free sharding_lab modules, through any chain of imports.
- The model knows nothing of parallelism.
- Private torch names are reached from `sharding_lab/engine/_torch_internals.py` alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("sharding_lab", "studyapp")
CLI_LAYER = {"sharding_lab.cli", "sharding_lab.labs.commands", "sharding_lab.estimate"}
INTERNALS = "sharding_lab.engine._torch_internals"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {
    module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
}


def imports(module: str, *, top_level_only: bool = False) -> set[str]:
    """Every module `module` imports (a `from a import b` counts a, and a.b when that is a module)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this package
                package = module.split(".")[: -node.level] if path.stem != "__init__" else module.split(".")
                if path.stem == "__init__" and node.level > 1:
                    package = package[: -(node.level - 1)]
                base = ".".join([*package, base] if base else package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return found


def with_parents(names: set[str]) -> set[str]:
    """Importing a.b.c runs a and a.b too."""
    return {".".join(name.split(".")[:i]) for name in names for i in range(1, name.count(".") + 2)}


def reachable(start: str, *, on_import: bool = False) -> set[str]:
    """Every module a chain of imports from `start` can reach (ours followed, others recorded); with
    `on_import`, only what importing `start` runs (top-level imports all the way down)."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module in MODULES:
            todo.extend(with_parents(imports(module, top_level_only=on_import)) - seen)
    return seen


def is_torch(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def is_engine(name: str) -> bool:
    return name == "sharding_lab.engine" or name.startswith("sharding_lab.engine.")


TORCH_FREE = sorted(m for m in MODULES if m.startswith("sharding_lab") and not is_engine(m) and m not in CLI_LAYER)


def test_the_graph_sees_function_level_imports():
    # The premise of the checks below: an import inside a function counts.
    assert "sharding_lab.engine.run_labs" in imports("sharding_lab.labs.commands")
    assert "sharding_lab.engine.run_labs" not in imports("sharding_lab.labs.commands", top_level_only=True)
    assert "torch" in reachable("sharding_lab.engine.measure")


@pytest.mark.parametrize("module", TORCH_FREE)
def test_sharding_lab_outside_the_engine_never_imports_torch(module):
    reached = reachable(module)
    assert not {m for m in reached if is_torch(m) or is_engine(m)}, module


@pytest.mark.parametrize("module", sorted(CLI_LAYER))
def test_the_cli_layer_reaches_the_engine_only_when_a_command_runs(module):
    on_import = reachable(module, on_import=True)
    assert not {m for m in on_import if is_torch(m) or is_engine(m)}, module


def test_studyapp_reaches_only_torch_free_sharding_lab_modules():
    reached = set().union(*(reachable(m) for m in MODULES if m.startswith("studyapp")))
    ours = {m for m in reached if m.startswith("sharding_lab")}
    assert ours, "studyapp shows the labs: it imports the catalogue and the registry"
    assert ours <= set(TORCH_FREE) | {"sharding_lab"}, sorted(ours - set(TORCH_FREE))
    assert not {m for m in reached if is_torch(m)}


def test_the_model_knows_nothing_of_parallelism():
    reached = imports("sharding_lab.engine.model")
    ours = {m for m in reached if m.startswith("sharding_lab")}
    assert ours <= {"sharding_lab.model_config"}  # its config and sizes, nothing else of ours
    assert not {m for m in reached if m.startswith("torch.distributed")}


def private_torch_uses(source: str) -> list[str]:
    """Private torch reached in `source`: imports of private torch modules or names, `x._name` on anything
    but the file's own names, `getattr(x, "_name")`, and private torch module paths in strings."""
    tree = ast.parse(source)
    defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    defined |= {
        target.attr for node in ast.walk(tree) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Attribute)
    }
    # Our own modules' private names are ours to use: names bound by importing sharding_lab modules.
    ours = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and (getattr(node, "module", None) or node.names[0].name).startswith("sharding_lab")
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and is_torch(node.module or ""):
            private = any(part.startswith("_") for part in node.module.split("."))
            found += [f"from {node.module} import {a.name}" for a in node.names if private or a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if is_torch(a.name) and "._" in a.name]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if owner not in ("self", "cls", "sys", "os", *ours) and node.attr not in defined:
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "setattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if (
                isinstance(name, ast.Constant) and str(name.value).startswith("_")
                and not str(name.value).startswith("__") and name.value not in defined
            ):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.search(r"\btorch(\.\w+)*\._", node.value):
                found.append(f"{node.value!r} (line {node.lineno})")
    return found


def test_the_private_torch_check_finds_each_kind_of_use():
    source = """
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.parallel.distributed import _MixedPrecision
import torch.utils._pytree
hooks = model._comm_hooks
getattr(model, "_comm_hooks")
importlib.import_module("torch.testing._internal.distributed.fake_pg")
"""
    assert len(private_torch_uses(source)) == 6
    assert private_torch_uses("self._phase = 1\nx = sys._getframe(2)\nmodel.__class__") == []


def test_private_torch_is_reached_from_one_module_only():
    engine_side = [m for m in MODULES if m.startswith("sharding_lab") and m != INTERNALS]
    offenders = {m: uses for m in engine_side if (uses := private_torch_uses(MODULES[m].read_text(encoding="utf-8")))}
    assert offenders == {}
    assert private_torch_uses(MODULES[INTERNALS].read_text(encoding="utf-8")), "and the internals module has them"
