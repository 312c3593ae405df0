"""Short text of report numbers: values, settings, percentages, intervals, timestamps.

Shared by the HTML index (:mod:`.export`), the notebook markdown (:mod:`.markdown`) and
the run labels (:mod:`.runs`), so a number reads the same on every page. Text that came
from a manifest, a config or a log goes into markdown through :func:`_md`, so it shows as
text and never as a tag, a link or table syntax.
"""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Mapping
from typing import Any


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.3e}"
    return html.escape(str(value))


# Markdown is rendered to HTML with raw tags passed through (nbconvert's mistune does not
# sanitize), so a value must be inert both as HTML and as markdown syntax: entities are
# decoded to literal text by the renderer and never parsed as syntax. One str.translate
# pass, so no entity is escaped again by a later replacement.
_MD_ENTITIES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "|": "&#124;",  # a table cell separator
    "`": "&#96;",  # a code span (escaping nothing inside it)
    "\\": "&#92;",
    "*": "&#42;",
    "_": "&#95;",
    "[": "&#91;",  # a link, [x](javascript:...)
    "]": "&#93;",
    "!": "&#33;",
    "#": "&#35;",
}
_MD_TABLE = str.maketrans(_MD_ENTITIES)


def _md(value: Any) -> str:
    """A value as inert markdown text: no tag, link, emphasis, code span or table cell break.

    Args:
        value: any value (a manifest field, a task name, a model path, a reason).

    Returns:
        ``str(value)`` on one line with HTML and markdown syntax characters as entities.
    """
    text = " ".join(str(value).splitlines())  # a newline would end a table row or list item
    return text.translate(_MD_TABLE)


def _setting(chosen: Mapping[str, Any] | None) -> str:
    if not chosen:
        return "–"
    return ", ".join(f"{k} = {_fmt(v)}" for k, v in chosen.items())


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _pct(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _points(row: Mapping[str, Any] | None) -> str:
    if not row:
        return "–"
    if row.get("accuracy_delta") is None:
        return "– (no scorer)"
    d, lo, hi = row["accuracy_delta"], row.get("delta_ci_low"), row.get("delta_ci_high")
    ci = f" [{100 * lo:+.1f}, {100 * hi:+.1f}]" if lo is not None and hi is not None else ""
    return f"{100 * d:+.1f} pt{ci}"


def _speed(row: Mapping[str, Any] | None) -> str:
    if not row or row.get("speedup_vs_reference") is None:
        return "–"
    s = f"{row['speedup_vs_reference']:.2f}×"
    if row.get("speedup_ci_low") is not None and row.get("speedup_ci_high") is not None:
        s += f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"
    return s


def _iv(iv: Mapping[str, Any] | None) -> str:
    """A speed-up interval dict (``speedup, ci_low, ci_high``) as ``1.23× [1.10, 1.40]``."""
    if not iv or iv.get("speedup") is None:
        return "–"
    s = f"{iv['speedup']:.2f}×"
    if iv.get("ci_low") is not None and iv.get("ci_high") is not None:
        s += f" [{iv['ci_low']:.2f}, {iv['ci_high']:.2f}]"
    return s
