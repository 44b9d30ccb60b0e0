"""Installs the JS clients of the e2e tests (Codex CLI, the Vercel AI SDK) into the cache folder.

    python -m tests.e2e.install    # what `make e2e` runs first; the tests call `ensure` too

`$E2E_CACHE` (default `.cache/e2e`, relative to the repository root) holds `node/`: a copy of
`tests/e2e/js/package.json` and its lock, installed with `npm ci`. A stamp holds the hash of
both files, so a second run costs nothing and a changed pin reinstalls. The Python client
(openai-agents) goes into the project's venv instead (the Makefile's pip install).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).resolve().parent / "js"
FILES = ("package.json", "package-lock.json")


def cache_dir() -> Path:
    return ROOT / os.environ.get("E2E_CACHE", ".cache/e2e")


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for name in FILES:
        digest.update((MANIFEST / name).read_bytes())
    return digest.hexdigest()


def _size(path: Path) -> int:
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def ensure(say: bool = False) -> Path:
    """The `node` folder under the cache, its clients installed as pinned in tests/e2e/js."""
    node = cache_dir() / "node"
    stamp = node / ".installed"
    wanted = _fingerprint()
    pins = json.loads((MANIFEST / "package.json").read_text())["dependencies"]
    listed = ", ".join(f"{name}@{pin}" for name, pin in pins.items())
    if stamp.exists() and stamp.read_text() == wanted:
        if say:
            print(f"e2e: {listed} already in {node}")
        return node
    if shutil.which("npm") is None:
        raise RuntimeError("e2e: npm not found: the e2e tests need Node >= 20 and npm")
    print(f"e2e: installing {listed} into {node} (npm ci)", flush=True)
    node.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    for name in FILES:
        shutil.copyfile(MANIFEST / name, node / name)
    started = time.monotonic()
    # --no-audit/--no-fund: no calls beyond the registry downloads; npm ci removes a stale node_modules.
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=node, check=True)
    print(f"e2e: installed in {time.monotonic() - started:.0f} s, {_size(node / 'node_modules') / 2**20:.0f} MiB", flush=True)
    stamp.write_text(wanted)
    return node


def main() -> int:
    ensure(say=True)
    try:
        print(f"e2e: openai-agents {version('openai-agents')} in {sys.prefix}")
    except PackageNotFoundError:
        print(f"e2e: openai-agents is missing from {sys.prefix}: pip install openai-agents", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
