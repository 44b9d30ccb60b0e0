"""The documentation site (`make docs`): its reference pages are made from the code at every
build (docs/hooks.py), so that they cannot drift; here, that each thing they list says what it
is."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_flag_says_what_it_does(hooks: ModuleType) -> None:
    flags = hooks.flags()
    assert any("--config" in flag.option_strings for flag in flags)
    assert [flag.option_strings for flag in flags if not (flag.help or "").strip()] == []
    page = hooks.cli_page()
    assert all(f"`{', '.join(flag.option_strings)}`" in page for flag in flags)


def test_every_metric_says_what_it_counts(hooks: ModuleType) -> None:
    metrics = hooks.metrics()
    assert "proxy_requests_total" in [name for name, *_ in metrics]
    assert [name for name, _, help, _ in metrics if len(help.strip()) < 10] == []
    page = hooks.metrics_page()
    assert all(f"`{name}`" in page for name, *_ in metrics)
