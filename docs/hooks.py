"""MkDocs hooks: the pages made from the code itself at every build, so that they cannot drift
from it: the configuration (the config's own types, each key's docstring, in the order of the
file), the command line (its `--help`), the metrics (the registry's own help), the errors (the
error tree); the rule book, docs/design.md, one page a section, each rule under its own heading
with the tests that cite it; the changelog; and every `design.md N.M` in the pages a link to its
rule. tests/test_docs.py fails where a key, a flag, a metric or an error has no description."""

from __future__ import annotations

import argparse
import ast
import inspect
import posixpath
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from mkdocs.structure.files import File, Files

from proxy import config as config_module
from proxy import errors as errors_module
from proxy.cli import parser
from proxy.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
GENERATED = {
    "reference/configuration.md": lambda: configuration_page(),
    "reference/cli.md": lambda: cli_page(),
    "reference/metrics.md": lambda: metrics_page(),
    "reference/errors.md": lambda: errors_page(),
    "reference/compatibility.md": lambda: compatibility_page(),
}


def on_files(files: Files, config: Any) -> Files:
    pages = {**GENERATED, "changelog.md": lambda: (ROOT / "CHANGELOG.md").read_text()}
    book = rule_book((ROOT / "docs" / "design.md").read_text())
    files.remove(files.get_file_from_path("design.md"))
    for path, page in pages.items():
        files.append(File.generated(config, path, content=page()))
    for path, text in book.items():
        files.append(File.generated(config, path, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Every `design.md N.M` (or `design.md N`) outside code a link to its rule's heading."""
    here = posixpath.dirname(page.file.src_uri)

    def link(match: re.Match[str]) -> str:
        number = match.group(1)
        target = posixpath.relpath(f"design/{number.split('.')[0]}.md", here or ".")
        anchor = f"#{number}" if "." in number else ""
        return f"[design.md {number}]({target}{anchor})"

    return re.sub(r"(?<![`\w/\[])design\.md (\d+(?:\.\d+)?)(?![\w`])", link, markdown)


# -- compatibility --------------------------------------------------------------------------------

WHAT_IS_DONE = {
    "fields honoured": "Request fields honoured",
    "fields ignored": "Request fields accepted and not sent upstream (they cannot change the tokens)",
    "fields refused": "Request fields refused with a 400 naming them (the proxy cannot honour them)",
    "items read": "Input items read",
    "items dropped": "Input items accepted and dropped (counted in `proxy_ignored_total`)",
    "items refused": "Input items refused with a 400 naming them",
}


def compatibility() -> dict[str, list[str]]:
    """design.md 8.15's block: every field and item type of the openai SDK, by what is done with
    it (tests/core/test_agent_requests.py checks it against the SDK)."""
    design = (ROOT / "docs" / "design.md").read_text()
    block = design[design.index("```text", design.index("### 8.15 ")) :]
    block = block[: block.index("```", 3)]
    return {
        kind: line.partition(":")[2].split()
        for line in block.splitlines()
        if (kind := line.partition(":")[0]) in WHAT_IS_DONE
    }


def compatibility_page() -> str:
    lines = [
        "# Compatibility with OpenAI",
        "",
        "What the proxy does with every request field and input item type that the installed `openai`",
        "SDK knows, read from design.md 8.15 at every build; a test checks that list against the SDK, so",
        "an SDK release with a name in none of them fails there first. Lenient with what cannot change",
        "the generated tokens, strict with what would (design.md 5.4). Each item's rules are in",
        "design.md 8.",
        "",
    ]
    for kind, names in compatibility().items():
        listed = ", ".join(f"`{name}`" for name in names) or "none"
        lines += [f"## {WHAT_IS_DONE[kind]}", "", listed, ""]
    return "\n".join(lines)


# -- the rule book --------------------------------------------------------------------------------

SECTION = re.compile(r"^## (\d+)\. (.+)$", re.M)
RULE = re.compile(r"^### (\d+\.\d+) (.+)$", re.M)


def rule_book(design: str) -> dict[str, str]:
    """docs/design.md as the site shows it: an index (its opening, then the sections), and a page
    a section whose every rule's heading is its number's anchor, with the tests that cite it."""
    cited = citations()
    found = list(SECTION.finditer(design))
    opening = design[: found[0].start()].strip()
    pages = {}
    index = [opening, "", "## Sections", ""]
    for number, match in enumerate(found):
        end = found[number + 1].start() if number + 1 < len(found) else len(design)
        section, title = match.group(1), match.group(2)
        index.append(f"- [{section}. {title}](design/{section}.md)")
        body = RULE.sub(lambda rule: f"## {rule[1]} {rule[2]} {{#{rule[1]}}}", design[match.end() : end])
        pages[f"design/{section}.md"] = f"# {section}. {title}\n{_pinned_at_ends(body, cited)}"
    pages["design.md"] = "\n".join(index) + "\n"
    return pages


def _pinned_at_ends(body: str, cited: dict[str, list[str]]) -> str:
    """After each rule, the tests that name it."""
    parts = re.split(r"(?m)^(## \d+\.\d+ .*)$", body)
    out = [parts[0]]
    for heading, text in zip(parts[1::2], parts[2::2], strict=True):
        number = heading.split()[1]
        tests = cited.get(number, [])
        pinned = f"\n*Pinned by* {', '.join(f'`{test}`' for test in tests)}.\n" if tests else ""
        out.append(f"{heading}\n{text.rstrip()}\n{pinned}\n")
    return "".join(out)


def citations() -> dict[str, list[str]]:
    """Each rule's tests: the test functions whose name, docstring or body cite it
    (`design.md 3.7`, `design.md 14.3, 14.5`), and the test files whose docstring does."""
    found: dict[str, list[str]] = {}

    def cite(text: str, where: str) -> None:
        for listed in re.findall(r"design\.md ((?:\d+\.\d+(?:, )?)+)", text):
            for number in listed.split(", "):
                if where not in found.setdefault(number, []):
                    found[number].append(where)

    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        cite(ast.get_docstring(tree) or "", str(path.relative_to(ROOT)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                cite(ast.get_source_segment(source, node) or "", f"{path.relative_to(ROOT)}::{node.name}")
    return found


# -- the command line -----------------------------------------------------------------------------


def flags() -> list[argparse.Action]:
    return [action for action in parser()._actions if action.option_strings]


def cli_page() -> str:
    rows = [
        f"| `{', '.join(action.option_strings)}` | {(action.help or '').replace('%(prog)s', 'responses-proxy')} |"
        for action in flags()
    ]
    return "\n".join(
        [
            "# Command line",
            "",
            "Generated from `responses-proxy --help` at every build.",
            "",
            "```text",
            parser().format_help().rstrip(),
            "```",
            "",
            "| flag | what it does |",
            "|---|---|",
            *rows,
            "",
        ]
    )


# -- metrics --------------------------------------------------------------------------------------


def metrics() -> list[tuple[str, str, str, list[str]]]:
    """Every metric of the registry: name, type, help, labels."""
    registry = Metrics().registry
    found = []
    for collector in registry._collector_to_names:  # prometheus_client keeps no public list
        name = collector._name  # type: ignore[attr-defined]
        kind = collector._type  # type: ignore[attr-defined]
        suffix = "_total" if kind == "counter" else ""
        found.append((name + suffix, kind, collector._documentation, list(collector._labelnames)))  # type: ignore[attr-defined]
    return sorted(found)


def metrics_page() -> str:
    rows = [
        f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels) or 'none'} | {help} |"
        for name, kind, help, labels in metrics()
    ]
    return "\n".join(
        [
            "# Metrics",
            "",
            "`GET /metrics` in Prometheus' text format; generated from the proxy's registry at every build.",
            "A histogram's series are `_bucket`, `_sum` and `_count`.",
            "",
            "| metric | type | labels | what it counts |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


# -- errors ---------------------------------------------------------------------------------------


def errors(root: type = errors_module.ProxyError, depth: int = 0) -> list[tuple[int, type]]:
    """The error tree, depth first, in the order of the module."""
    found = [(depth, root)]
    for kind in root.__subclasses__():
        found += errors(kind, depth + 1)
    return found


def errors_page() -> str:
    rows = []
    for depth, kind in errors():
        doc = " ".join(inspect.cleandoc(kind.__doc__ or "").split())
        name = "&nbsp;&nbsp;" * depth + f"`{kind.__name__}`"
        rows.append(f"| {name} | {kind.status} | `{kind.type}` | `{kind.code}` | {doc} |")  # type: ignore[attr-defined]
    return "\n".join(
        [
            "# Errors",
            "",
            "Every error is an HTTP status with the OpenAI envelope,",
            '`{"error": {"message", "type", "param", "code"}}`, `param` naming the field at fault. Once a',
            "stream has begun, a failure is its `response.failed` event instead, its `error.code` one of",
            "the API's own. Generated from `proxy/errors.py` at every build: a subclass answers as its",
            "parent unless it says otherwise.",
            "",
            "| error | status | type | code | when |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


# -- configuration --------------------------------------------------------------------------------


def docstrings(cls: type) -> dict[str, str]:
    """A Struct's fields' docstrings: the string that stands under a field in its class body."""
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    found = {}
    for field, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[field.target.id] = inspect.cleandoc(after.value.value)
    return found


def sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type, msgspec.structs.FieldInfo, str | None]]:
    """Every key under `cls`, depth first, in the order of the file: (its path, the Struct that
    holds it, the field, its docstring)."""
    described = docstrings(cls)
    for field in msgspec.structs.fields(cls):
        path = f"{prefix}{field.encode_name}"
        yield path, cls, field, described.get(field.name)
        nested = _struct_of(field.type)
        if nested is not None:
            yield from sections(nested, f"{path}[]." if _is_list(field.type) else f"{path}.")


def _struct_of(annotation: Any) -> type | None:
    for candidate in _parts(annotation):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def _parts(annotation: Any) -> Iterator[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from _parts(typing.get_args(annotation)[0])
    elif origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _parts(arg)
    else:
        yield annotation


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(part) is list for part in [annotation, *typing.get_args(annotation)])


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        return "map"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: msgspec.structs.FieldInfo) -> str:
    if field.required:
        return "required"
    value = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
    if isinstance(value, msgspec.Struct):
        return "(its keys' defaults)"
    return f"`{msgspec.json.encode(value).decode()}`"


def configuration_page() -> str:
    lines = [
        "# Configuration",
        "",
        "Every key of the config file (`responses-proxy --config FILE`; check one with",
        "`--check-config FILE`), generated from the config's own types at every build, in the order of",
        "`proxy/config.py`. A key left out takes its default; an unknown key is an error that names it.",
        "`configs/proxy.example.yaml` shows them in use.",
        "",
    ]
    for path, _, field, doc in sections(config_module.Config):
        lines += [f"### `{path}`", "", f"{_type_name(field.type)}, default {_default(field)}", "", doc or "", ""]
    return "\n".join(lines)
