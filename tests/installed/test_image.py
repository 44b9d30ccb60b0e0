"""The container image, mirrored where no registry of base images can be reached: the wheel the
Dockerfile installs, in a fresh environment, run as the Dockerfile's unprivileged user from files
it cannot write, with only its state folder writable, and the Dockerfile's own HEALTHCHECK
command run against it. What this does not check: the base image itself (its Python, its
libraries), and Docker's own handling of the VOLUME and the signals."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import pytest

from tests.client import LOGPROBS, eventually, stream
from tests.events import check_stream
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
GEN = Generation([Step("text", "Hi", [score("Hi")]), Step("finish", finish_reason="stop")])


def instructions() -> dict[str, list[str]]:
    """The Dockerfile's instructions of the final stage, each kind's arguments in order."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    final = text[text.rindex("\nFROM ") :]
    found: dict[str, list[str]] = {}
    for kind, argument in re.findall(r"^([A-Z]+)\s+(.*)$", final, re.M):
        found.setdefault(kind, []).append(argument.strip())
    return found


def environment_variables(image: dict[str, list[str]]) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", " ".join(image.get("ENV", []))))


def as_user(uid: int, gid: int) -> dict:
    return {"user": uid, "group": gid, "extra_groups": []}


def interpreter_for(uid: int, gid: int) -> str:
    """A Python 3.11+ that the unprivileged user can run (one under root's home cannot be)."""
    for candidate in (sys._base_executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and Path(candidate).exists():
            try:
                subprocess.run(
                    [candidate, "-c", "import sys, venv; assert sys.version_info >= (3, 11)"],
                    capture_output=True, check=True, **as_user(uid, gid),
                )
            except (OSError, subprocess.CalledProcessError):
                continue
            return candidate
    pytest.skip(f"no Python 3.11+ with venv that uid {uid} can run")


@pytest.fixture(scope="module")
def wheel() -> Path:
    named = os.environ.get("RESPONSES_PROXY_WHEEL")
    if not named:
        pytest.skip("RESPONSES_PROXY_WHEEL names no wheel: `make smoke` builds it and sets it")
    return Path(named)


async def test_the_wheel_runs_as_the_image_runs_it(wheel: Path, upstream: FakeUpstream) -> None:
    if os.geteuid() != 0:
        pytest.skip("running as the image's user takes root")
    image = instructions()
    with tempfile.TemporaryDirectory(prefix="image-") as folder:  # pytest's own are root's alone
        root = Path(folder)
        root.chmod(0o755)
        await run_the_image(root, image, wheel, upstream)


async def run_the_image(root: Path, image: dict[str, list[str]], wheel: Path, upstream: FakeUpstream) -> None:
    uid, gid = (int(part) for part in image["USER"][-1].split(":"))
    # The files as the image holds them: root's, which the proxy's user reads and cannot write.
    env = root / "venv"
    subprocess.run([interpreter_for(uid, gid), "-m", "venv", env], check=True)
    subprocess.run([env / "bin" / "pip", "install", "-q", wheel], check=True, capture_output=True)
    config = root / "etc" / "proxy.yaml"
    config.parent.mkdir()
    shutil.copy(ROOT / "configs" / "proxy.yaml", config)
    subprocess.run(["chmod", "-R", "a-w", env, config.parent], check=True)
    state = root / "var"
    state.mkdir()
    os.chown(state, uid, gid)

    entrypoint, (option, _) = json.loads(image["ENTRYPOINT"][-1]), json.loads(image["CMD"][-1])
    port = free_port()
    variables = {**environment_variables(image), "PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(state)}
    upstream.script(Reply(GEN))
    log = (root / "proxy.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *entrypoint, option, str(config), "--port", str(port), "--upstream", upstream.url,
        cwd=state, env=variables, stdout=log, stderr=log, **as_user(uid, gid),
    )
    try:
        # The Dockerfile's HEALTHCHECK, as Docker runs it in the container, on this port.
        probe = [part.replace(":8080/", f":{port}/") for part in json.loads(image["HEALTHCHECK"][-1].split(" CMD ", 1)[1])]

        def healthy() -> bool:
            assert proc.returncode is None, (root / "proxy.log").read_text()
            return subprocess.run(probe, env=variables, cwd=state, capture_output=True, **as_user(uid, gid)).returncode == 0

        await eventually(healthy, 20)
        async with aiohttp.ClientSession() as http:
            run = check_stream(await stream(http, f"http://127.0.0.1:{port}", {"model": "m", "input": "hi", "include": LOGPROBS}))
        assert run.terminal == "response.completed", run.events[-1]
        assert [entry["token"] for entry in run.logprobs] == ["Hi"]
        written = sorted(path.relative_to(state).as_posix() for path in state.rglob("*") if path.is_file())
        assert "state/responses.db" in written, written
    finally:
        proc.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(proc.wait(), 40)
        log.close()
    assert returncode == 0, (root / "proxy.log").read_text()
    assert "Traceback" not in (root / "proxy.log").read_text()
