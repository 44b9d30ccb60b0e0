"""The installed console script as an operator runs it: its version, every config the repository
ships checked, a start with the default config, one streamed call with scores through the openai
SDK, the operational endpoints, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import aiohttp
import openai

from tests.client import LOGPROBS, eventually
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import Spawned, scrape
from tests.test_deploy import MANIFESTS, proxy_pods

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
GEN = Generation(
    [
        Step("reasoning", "Hm", [score("Hm")]),
        Step("text", "Hello", [score("Hello", -0.1)]),
        Step("text", " there", [score(" there")]),
        Step("finish", finish_reason="stop"),
    ]
)


def run_in(environment: Path, code: str, cwd: Path) -> str:
    return subprocess.run([environment, "-c", code], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_the_package_is_imported_from_its_own_environment(environment: Path, tmp_path: Path) -> None:
    """Nothing of the checkout can stand in for what was installed."""
    where = Path(run_in(environment, "import proxy; print(proxy.__file__)", tmp_path))
    assert where.is_relative_to(environment.parent.parent), where
    assert not where.is_relative_to(ROOT), where


def test_version_is_the_distributions(console_script: Path, environment: Path, tmp_path: Path) -> None:
    metadata = run_in(environment, "import importlib.metadata as m; print(m.version('responses-proxy'))", tmp_path)
    shown = subprocess.run([console_script, "--version"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["responses-proxy", metadata]


def shipped_configs(tmp_path: Path) -> list[Path]:
    """configs/*.yaml, and the config of every proxy in the Kubernetes manifests, as files."""
    inline = []
    for manifest in MANIFESTS:
        for pod in proxy_pods(manifest):
            inline.append(tmp_path / f"{manifest.stem}-{pod.name}.yaml")
            inline[-1].write_text(pod.config_text)
    return [*SHIPPED, *inline]


def test_every_config_the_repository_ships_is_valid(console_script: Path, tmp_path: Path) -> None:
    configs = shipped_configs(tmp_path)
    assert len(configs) >= len(SHIPPED) + len(MANIFESTS)
    for path in configs:
        check = subprocess.run([console_script, "--check-config", path], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, f"{path.name}:\n{check.stdout}{check.stderr}"
        assert check.stdout.strip(), f"{path.name}: --check-config printed no route"


async def test_the_default_config_serves_a_streamed_call_with_scores_and_stops_cleanly(
    console_script: Path, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The shipped default config (its upstream replaced by --upstream, as the README shows), the
    default SQLite store in the working folder."""
    upstream.script(Reply(GEN))
    proxy = await Spawned.start([console_script, "--upstream", upstream.url], ROOT / "configs" / "proxy.yaml", cwd=tmp_path)
    try:
        async with openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=10) as client:
            stream = await client.responses.create(
                model="m", input="hi", include=LOGPROBS, top_logprobs=2, stream=True  # type: ignore[arg-type]
            )
            events = [event async for event in stream]
        deltas = [event for event in events if event.type == "response.output_text.delta"]
        completed = events[-1]
        assert completed.type == "response.completed"
        text = completed.response.output[-1].content[0]
        assert text.text == "Hello there"
        assert [entry.token for entry in text.logprobs] == ["Hm", "Hello", " there"]
        assert [alt.token for alt in text.logprobs[1].top_logprobs] == ["Hello", "Hello#1"]
        assert text.logprobs[1].logprob == -0.1
        assert [entry.token for delta in deltas for entry in delta.logprobs] == ["Hm", "Hello", " there"]
        assert upstream.requests[-1]["logprobs"] is True and upstream.requests[-1]["top_logprobs"] == 2
        assert (tmp_path / "state" / "responses.db").is_file(), "the default store is a file in the working folder"

        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.url}/health") as health:
                assert health.status == 200
                version = (await health.json())["version"]
            async with http.get(f"{proxy.url}/ready") as ready:
                assert ready.status == 200, await ready.text()

            async def counted() -> bool:  # once the stream's last bytes are written
                metrics = await scrape(http, proxy.url)
                assert any(name == "proxy_build_info" and ("version", version) in labels for name, labels in metrics)
                answered = {labels: value for (name, labels), value in metrics.items() if name == "proxy_requests_total"}
                return [value for labels, value in answered.items() if ("endpoint", "/v1/responses") in labels] == [1]

            await eventually(counted)
    finally:
        proxy.proc.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(proxy.proc.wait(), 40)
    assert returncode == 0, proxy.stderr()
    assert "Traceback" not in proxy.stderr(), proxy.stderr()
