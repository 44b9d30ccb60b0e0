"""What users install holds the product (design.md 2.6): the sdist and the wheel built by the standard `build`
frontend carry every file of the source tree's `proxy/` package, compared with the tree itself
(not with a list kept by hand), so a folder without its `__init__.py` or a new data file that the
package data leaves out fails here, where an editable install would import it anyway."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from proxy import __version__

ROOT = Path(__file__).resolve().parents[1]


def source_files() -> set[str]:
    """Every file under `proxy/` as the checkout has it, bytecode aside."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "proxy").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from that sdist (what `python -m build` does)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True, capture_output=True)
    return out


def test_the_wheel_holds_every_file_of_the_package(built: Path) -> None:
    (wheel,) = built.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("proxy/")}
    assert sorted(source_files() - shipped) == []


def test_the_sdist_holds_every_file_of_the_package(built: Path) -> None:
    (sdist,) = built.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        # Each member is under the sdist's own top folder, `responses_proxy-<version>/`.
        shipped = {name.split("/", 1)[1] for name in archive.getnames() if "/proxy/" in name}
    assert sorted(source_files() - shipped) == []


def test_the_wheel_carries_no_file_from_outside_the_package(built: Path) -> None:
    """Only `proxy/` and the distribution's metadata: never tests or a stray build folder."""
    (wheel,) = built.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"proxy"}


# What a sidecar that names no MCP server, no Redis store and no tracing, and has read no PDF and
# run no tool search, must not pay for (design.md 2.6): each is imported where its feature is
# configured or first used.
FEATURES_NOT_CONFIGURED = {
    "mcp", "mcp_types", "starlette", "sse_starlette", "pydantic", "anyio", "uvicorn", "redis", "opentelemetry", "pypdfium2",
    "bm25s", "numpy",
}

PLAIN_START = """
import asyncio, sys
from proxy.config import single_upstream
from proxy.server import create_app, serve

async def main():
    config = single_upstream("http://127.0.0.1:9")
    runner = await serve(create_app(config), "127.0.0.1", 0, connections=config.connections)
    await runner.cleanup()

asyncio.run(main())
print("\\n".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_a_plain_start_imports_no_feature_it_does_not_use(tmp_path: Path) -> None:
    """design.md 2.6: the default config's app (its SQLite store in the working folder) started
    and stopped."""
    started = subprocess.run([sys.executable, "-c", PLAIN_START], cwd=tmp_path, capture_output=True, text=True, check=True)
    imported = set(started.stdout.split())
    assert "proxy" in imported and "aiohttp" in imported
    assert sorted(imported & FEATURES_NOT_CONFIGURED) == []


def test_the_changelog_says_what_this_version_changed() -> None:
    """design.md 12.2: an operator reads what the version they run changed; its section is the
    newest, and every version is named once."""
    versions = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert versions[:1] == [__version__]
    assert len(versions) == len(set(versions))
