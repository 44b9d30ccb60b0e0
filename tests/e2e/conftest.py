"""Fixtures of the e2e tests: the installed clients. The fake upstream (`upstream`) and the
proxy in front of it (`proxy`) are the suite's own, from tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import install
from tests.e2e.clients import Codex


@pytest.fixture(scope="session")
def node() -> Path:
    """The cache's node folder, installed if it is not yet (`make e2e` installs it first)."""
    return install.ensure()


@pytest.fixture
def codex(node: Path) -> Codex:
    # CODEX_HOME under the cache: under /tmp, Codex warns that it cannot make its PATH aliases.
    return Codex(node, install.cache_dir() / "codex-homes")
