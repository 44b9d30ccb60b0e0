"""design.md 2.1: imports run one way, HTTP layer -> upstream client -> core -> errors, and
every rule a code comment cites exists in docs/design.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "proxy"

# What each layer may import from the package, besides itself.
ALLOWED = {
    "turns": {"errors", "config", "runtime", "metrics", "tracing", "background", "sink", "responses", "store", "upstream"},
    "responses": {"errors"},
    "sink": {"errors"},
    "background": {"errors", "config", "sink", "responses", "store", "upstream"},
    "upstream": {"errors", "config", "responses", "limits"},
    "config": {"errors", "responses"},
    "store": {"errors", "limits"},
    "limits": set(),
}


def imported_modules(path: Path) -> set[str]:
    """The `proxy` modules one source file imports, as dotted names below `proxy`."""
    module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                name = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            elif (node.module or "").startswith("proxy."):
                name = node.module.removeprefix("proxy.")
            else:
                continue
            found.add(name)
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_run_one_way(layer: str) -> None:
    files = [PACKAGE / f"{layer}.py"] if (PACKAGE / f"{layer}.py").exists() else sorted((PACKAGE / layer).glob("*.py"))
    assert files
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top == layer or top in ALLOWED[layer], f"{path.relative_to(ROOT)} imports proxy.{name}"


def test_the_turn_layer_knows_no_http_framework() -> None:
    """design.md 2.1: a turn is planned, run and kept without an aiohttp request or response;
    the HTTP handlers and the WebSocket adapt their transport to it."""
    for path in sorted((PACKAGE / "turns").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{alias.name}" for alias in node.names]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            assert not [name for name in names if name.startswith("aiohttp")], f"{path.relative_to(ROOT)} imports {names}"


def test_cited_rules_exist() -> None:
    """Every rule is under a heading of its own, `### N.M Title` (the site links it by number),
    and every rule a comment or a test cites is one."""
    design = (ROOT / "docs" / "design.md").read_text()
    rules = set(re.findall(r"^### (\d+\.\d+) ", design, re.M)) | set(re.findall(r"^## (\d+)\.", design, re.M))
    cited = {
        (path.relative_to(ROOT), rule)
        for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
        for rule in re.findall(r"design\.md (\d+(?:\.\d+)?)", path.read_text())
    }
    assert cited, "no citation found: the pattern is stale"
    assert [(str(path), rule) for path, rule in sorted(cited) if rule not in rules] == []


def layout_paths(design: str) -> set[str]:
    """The module paths section 2's tree names, as `proxy/...` paths: one name a line, nested
    two spaces a level."""
    block = design.split("## 2. Layout", 1)[1].split("```", 2)[1]
    parents: list[str] = []
    paths = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        name = line.split()[0]
        parents[depth:] = [name.rstrip("/")]
        if name.endswith(".py"):
            paths.add("/".join(parents))
    return paths


def test_every_module_is_in_the_layout() -> None:
    """design.md 2: section 2 names every module under proxy/ that holds code, and no other."""
    design = (ROOT / "docs" / "design.md").read_text()
    modules = {str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py") if path.read_text().strip()}
    assert modules, "no module found: the package moved"
    named = layout_paths(design)
    assert sorted(modules - named) == [] and sorted(named - modules) == []
