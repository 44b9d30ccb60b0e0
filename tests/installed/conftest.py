"""The installed package's tests (`make smoke`): the console script that `RESPONSES_PROXY` names,
from a wheel installed into an environment of its own, run from folders outside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import INSTALLED

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def console_script() -> Path:
    if not INSTALLED:
        pytest.skip("RESPONSES_PROXY names no installed console script: `make smoke` installs the wheel and sets it")
    script = Path(INSTALLED)
    assert script.is_file(), script
    return script


@pytest.fixture(scope="session")
def environment(console_script: Path) -> Path:
    """The installed environment's interpreter, where its console script runs."""
    return console_script.with_name("python")

