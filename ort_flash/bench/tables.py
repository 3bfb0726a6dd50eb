"""Plain tables: one (header, rows) shape rendered as aligned text for the terminal or as
Markdown for docs/PERFORMANCE.md, so the printed table and the published one are the same."""
from __future__ import annotations

from typing import Sequence


def fmt(value, digits: int = 3) -> str:
    """Numbers to ~3 significant digits; None to an en dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def text_table(header: Sequence[str], rows: Sequence[Sequence], title: str | None = None) -> str:
    cells = [list(map(str, header))] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title] if title else []
    for j, row in enumerate(cells):
        lines.append("  " + "  ".join(c.rjust(w) if j and _numeric(c) else c.ljust(w)
                                       for c, w in zip(row, widths)).rstrip())
        if j == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    def esc(c):
        return fmt(c).replace("|", "\\|")
    cells = [[esc(c) for c in row] for row in rows]
    numeric = [all(_numeric(r[i]) or r[i] == "–" for r in cells) and cells for i in range(len(header))]
    lines = ["| " + " | ".join(map(str, header)) + " |",
             "|" + "|".join("--:" if num else "---" for num in numeric) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    s = s.rstrip("x%×")
    try:
        float(s)
        return True
    except ValueError:
        return False
