"""The real JS clients, run as subprocesses against a proxy URL: what they did comes back as data.

Codex and the AI SDK run from the cache folder's `node/` (tests/e2e/install.py). The event
loop keeps serving the in-process proxy and fake upstream while a client runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AI_SDK_SCRIPT = Path(__file__).resolve().parent / "js" / "ai_sdk.mjs"
TIMEOUT = 120.0


@dataclass
class Finished:
    rc: int
    stdout: str
    stderr: str


async def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = TIMEOUT) -> Finished:
    """Run `cmd` to its end; past `timeout`, kill its whole process group (Codex's node
    wrapper spawns the native binary) and fail with what it printed."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=cwd, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        raise AssertionError(f"{Path(cmd[0]).name} ran past {timeout} s\nstdout: {out.decode()[-3000:]}\nstderr: {err.decode()[-3000:]}") from None
    assert proc.returncode is not None
    return Finished(proc.returncode, out.decode(), err.decode())


@dataclass
class CodexRun:
    rc: int
    events: list[dict[str, Any]]  # the --json lines
    stderr: str

    def completed(self, item_type: str) -> list[dict[str, Any]]:
        return [e["item"] for e in self.events if e["type"] == "item.completed" and e["item"]["type"] == item_type]

    @property
    def answer(self) -> str | None:
        messages = self.completed("agent_message")
        return messages[-1]["text"] if messages else None

    @property
    def transcript(self) -> str:
        """What Codex printed, for assertion messages (pytest cuts the repr of an object short)."""
        return f"codex rc={self.rc}\n" + "\n".join(map(json.dumps, self.events)) + f"\nstderr: {self.stderr[-3000:]}"


@dataclass
class Codex:
    node: Path  # the cache's node folder
    homes: Path  # where each run's fresh CODEX_HOME is made

    async def exec(
        self,
        base_url: str,
        prompt: str,
        workdir: Path,
        *,
        model: str = "qwen3",
        flags: tuple[str, ...] = (),
        name: str = "local",
        command_auth: bool = False,
    ) -> CodexRun:
        """`codex exec` with only a custom provider configured (`name`: the provider's, which
        Codex reads: "OpenAI" turns its remote compaction on; `command_auth`: its key from a
        command, which makes Codex read the provider's model cards); the other flags are quiet
        ones: no retries (a failure shows at once), no plugin sync, apps or analytics (no
        connection but the proxy; the request bodies are the same without them)."""
        self.homes.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(dir=self.homes))
        key = {"auth": '{command="echo",args=["e2e"]}'} if command_auth else {"env_key": "E2E_CODEX_KEY"}
        provider = {
            "name": name, "base_url": f"{base_url}/v1", "wire_api": "responses", **key,
            "request_max_retries": "0", "stream_max_retries": "0",
        }
        config = [arg for key, value in provider.items() for arg in ("-c", f"model_providers.local.{key}={value}")]
        cmd = [
            str(self.node / "node_modules" / ".bin" / "codex"), "exec", "--skip-git-repo-check", "--json", "--ephemeral",
            "-C", str(workdir), *config, "-c", "model_provider=local",
            "-c", "analytics.enabled=false", "--disable", "plugins", "--disable", "apps",
            "-m", model, *flags, prompt,
        ]
        try:
            done = await run(cmd, {**os.environ, "CODEX_HOME": str(home), "E2E_CODEX_KEY": "e2e"}, cwd=workdir)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return CodexRun(done.rc, events, done.stderr)


async def ai_sdk(node: Path, base_url: str, mode: str, provider_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """tests/e2e/js/ai_sdk.mjs: its JSON report (steps, text, errors, stream part types)."""
    cmd = ["node", str(AI_SDK_SCRIPT), "--base-url", f"{base_url}/v1", "--mode", mode]
    if provider_options is not None:
        cmd += ["--provider-options", json.dumps(provider_options)]
    done = await run(cmd, {**os.environ, "E2E_NODE_DIR": str(node)})
    assert done.rc == 0 and done.stdout.startswith("{"), f"ai_sdk.mjs rc={done.rc}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report
