"""The documentation site (`make docs`): its reference pages are made from the code at every
build (docs/hooks.py), so that they cannot drift; here, that each thing they list says what it
is."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from asyncio.subprocess import PIPE
from pathlib import Path
from types import ModuleType

import pytest

from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score

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


def test_every_config_key_says_what_it_does(hooks: ModuleType) -> None:
    """Each key of the config file has its docstring in proxy/config.py, in the order of the file,
    and the reference page shows every key with its type and default."""
    keys = list(hooks.sections(hooks.config_module.Config))
    paths = [path for path, *_ in keys]
    assert {"upstreams[].urls", "store.url", "mcp.allowed_servers", "listen.port"} <= set(paths)
    assert [path for path, _, _, doc in keys if not doc or len(doc) < 10] == []
    page = hooks.configuration_page()
    assert all(f"### `{path}`" in page for path in paths)


def test_every_error_says_when_it_is_answered(hooks: ModuleType) -> None:
    kinds = [kind for _, kind in hooks.errors()]
    assert {"InvalidRequest", "Conflict", "NotImplementedHere", "UpstreamTimeout"} <= {kind.__name__ for kind in kinds}
    assert [kind.__name__ for kind in kinds if not (kind.__doc__ or "").strip()] == []
    page = hooks.errors_page()
    assert all(f"`{kind.__name__}`" in page for kind in kinds)


def test_the_compatibility_page_lists_every_name_design_md_8_15_sorts(hooks: ModuleType) -> None:
    listed = hooks.compatibility()
    assert set(listed) == set(hooks.WHAT_IS_DONE)
    assert "top_logprobs" in listed["fields honoured"] and "item_reference" in listed["items read"]
    page = hooks.compatibility_page()
    assert all(f"`{name}`" in page for names in listed.values() for name in names)


# A code block of the guides marked `<!-- runnable -->` runs here against the proxy and the fake
# upstream, its `http://localhost:8080` the proxy's address: a quick start that stops working fails.
RUNNABLE = re.compile(r"<!-- runnable -->\n```(sh|python)\n(.*?)\n```", re.S)
RUNNERS = {"sh": ["bash", "-euo", "pipefail", "-c"], "python": [sys.executable, "-c"]}
ANSWER = Generation(
    [
        Step("reasoning", "Greet", [score("Greet")]),
        Step("text", "Hello", [score("Hello", -0.1, top=3)]),
        Step("text", " there", [score(" there", -0.4, top=3)]),
        Step("finish", finish_reason="stop"),
    ]
)


def runnable_examples() -> list[tuple[str, str, str]]:
    return [
        (f"{page.relative_to(ROOT)}#{number}", language, code)
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for number, (language, code) in enumerate(RUNNABLE.findall(page.read_text()))
    ]


def test_the_quick_start_has_runnable_examples() -> None:
    assert {language for where, language, _ in runnable_examples() if "quickstart" in where} == {"sh", "python"}


@pytest.mark.parametrize(("where", "language", "code"), runnable_examples(), ids=lambda value: str(value)[:40])
async def test_a_runnable_example_runs(where: str, language: str, code: str, upstream: FakeUpstream, proxy: str) -> None:
    upstream.choose = lambda _: Reply(ANSWER)
    run = await asyncio.create_subprocess_exec(
        *RUNNERS[language], code.replace("http://localhost:8080", proxy), stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 0, f"{where}:\n{out.decode()}{err.decode()}"
    assert "Hello" in out.decode(), f"{where} showed nothing of the answer:\n{out.decode()}"
    assert upstream.requests, f"{where} reached no upstream"
