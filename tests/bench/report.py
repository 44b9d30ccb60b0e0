"""The result table: rows of (metric, proxy, baseline, direct, comparison, target, result, note),
printed as plain text or markdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

COLUMNS = ("metric", "proxy", "baseline", "direct", "proxy vs baseline", "target", "result", "note")


@dataclass
class Row:
    metric: str
    proxy: str
    baseline: str = "-"
    direct: str = "-"
    compare: str = "-"
    target: str = "-"
    ok: bool | None = None  # None: no target
    note: str = ""

    def cells(self) -> list[str]:
        result = "-" if self.ok is None else ("PASS" if self.ok else "FAIL")
        return [self.metric, self.proxy, self.baseline, self.direct, self.compare, self.target, result, self.note]


def ms(seconds: float, sign: bool = False) -> str:
    return f"{seconds * 1000:{'+' if sign else ''}.3f} ms"


def text_table(rows: list[Row]) -> str:
    return text_grid(COLUMNS, [row.cells() for row in rows])


def markdown_table(rows: list[Row]) -> str:
    return markdown_grid(COLUMNS, [row.cells() for row in rows])


def text_grid(columns: Sequence[str], cells: list[list[str]]) -> str:
    """Any table (a bench of its own columns), as plain text."""
    table = [list(columns), *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown_grid(columns: Sequence[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in cells]
    return "\n".join(lines)


def print_grid(header: str, columns: Sequence[str], cells: list[list[str]], markdown: bool) -> None:
    """A bench's table under its header, as text, and again as markdown where asked (for README)."""
    print(header + "\n\n" + text_grid(columns, cells))
    if markdown:
        print("\n" + header + "\n\n" + markdown_grid(columns, cells))


def as_json(rows: list[Row]) -> list[dict]:
    return [asdict(row) for row in rows]
