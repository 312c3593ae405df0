"""Short text of report numbers: values, settings, percentages, intervals, timestamps.

Shared by the HTML pages (:mod:`.export`) and the notebook markdown (:mod:`.markdown`),
so a number reads the same on every page. Text that came
from a manifest, a config or a log goes into markdown through :func:`_md`, so it shows as
text and never as a tag, a link or table syntax.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections.abc import Callable, Mapping
from typing import Any

from relaxspec_audit.audit.records import Interval, SettingRow


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


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _pct(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _points(row: SettingRow | None) -> str:
    """A setting's accuracy delta in points with its interval and one-sided bound."""
    if not row:
        return "–"
    if row.accuracy_delta is None:
        return "– (no scorer)"
    d, lo, hi = row.accuracy_delta, row.delta_ci_low, row.delta_ci_high
    ci = f" [{100 * lo:+.1f}, {100 * hi:+.1f}]" if lo is not None and hi is not None else ""
    # The non-inferiority test reads the one-sided bound, which the two-sided interval
    # does not show; without it a PASS whose interval crosses −δ looks like an error.
    ni = row.delta_ni_low
    bound = f", one-sided bound {100 * ni:+.1f}" if ni is not None and lo is not None else ""
    return f"{100 * d:+.1f} pt{ci}{bound}"


def _speed(row: SettingRow | None) -> str:
    """A setting's modelled speed-up over its reference with its interval."""
    if not row:
        return "–"
    return times(row.speedup_vs_reference, row.speedup_ci_low, row.speedup_ci_high)


def _iv(iv: Interval | None) -> str:
    """A speed-up interval as ``1.23× [1.10, 1.40]``."""
    if not iv:
        return "–"
    return times(iv.speedup, iv.ci_low, iv.ci_high)


# ---------------------------------------------------------------------- tables for readers


def _num(value: Any) -> float | None:
    """``value`` as a finite-or-inf float, None for a missing value (None, NaN, non-number)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def _ci(lo: Any, hi: Any, one: Callable[[float], str]) -> str:
    lo, hi = _num(lo), _num(hi)
    return "" if lo is None or hi is None else f" [{one(lo)}, {one(hi)}]"


def pct(value: Any, lo: Any = None, hi: Any = None) -> str:
    """A share as percent (``12.5%``); shares under 1 % keep two significant digits."""
    v = _num(value)
    if v is None:
        return "–"

    def one(x: float) -> str:
        return f"{100 * x:.2g}%" if 0 < abs(x) < 0.01 else f"{100 * x:.1f}%"

    return one(v) + _ci(lo, hi, one)


def pt(value: Any, lo: Any = None, hi: Any = None) -> str:
    """A score difference in percentage points, signed (``+1.2 pt [−0.5, +3.0]``)."""
    v = _num(value)
    if v is None:
        return "–"
    return f"{100 * v:+.1f} pt" + _ci(lo, hi, lambda x: f"{100 * x:+.1f}")


def times(value: Any, lo: Any = None, hi: Any = None) -> str:
    """A ratio such as a speed-up (``1.23× [1.10, 1.40]``)."""
    v = _num(value)
    if v is None:
        return "–"
    return f"{v:.2f}×" + _ci(lo, hi, lambda x: f"{x:.2f}")


def nats(value: Any, lo: Any = None, hi: Any = None) -> str:
    """An entropy or log-likelihood in nats (``0.42 nats [0.30, 0.55]``)."""
    v = _num(value)
    if v is None:
        return "–"
    return f"{v:.2f} nats" + _ci(lo, hi, lambda x: f"{x:.2f}")


def num(value: Any, lo: Any = None, hi: Any = None) -> str:
    """A plain number, 3 significant digits (integers as they are)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    v = _num(value)
    if v is None:
        return "–"
    return f"{v:.3g}" + _ci(lo, hi, lambda x: f"{x:.3g}")


def yes_no(value: Any) -> str:
    """A flag as ``yes`` / ``no`` (``–`` when missing)."""
    return "–" if value is None else ("yes" if value else "no")


def text(value: Any) -> str:
    """A label as it is (``–`` when missing)."""
    return "–" if value is None else str(value)


#: A table column: a frame column name (or several, passed to the formatter in order, for
#: an estimate with its interval) → ``(header, formatter)``.
Columns = Mapping[str | tuple[str, ...], tuple[str, Callable[..., str]]]

_NUMERIC = {pct, pt, times, nats, num}


def table_html(frame: Any, columns: Columns, *, caption: str | None = None) -> str:
    """A formatted, escaped HTML table of ``frame`` for a report page (no dataframe repr).

    Args:
        frame: a polars DataFrame, or a sequence of row dicts.
        columns: ``{column or (estimate, ci_low, ci_high): (header, formatter)}`` in display
            order; formatters are :func:`pct`, :func:`pt`, :func:`times`, :func:`nats`,
            :func:`num`, :func:`yes_no`, :func:`text` or any ``f(*values) -> str``.
        caption: optional caption above the table.

    Returns:
        ``<div class="table-wrap"><table>…</table></div>``: every header and cell escaped,
        numbers right-aligned; the wrapper scrolls sideways instead of widening the page.

    Raises:
        ValueError: ``columns`` names a column the frame does not have.
    """
    rows = frame.to_dicts() if hasattr(frame, "to_dicts") else [dict(r) for r in frame]
    have = set(frame.columns) if hasattr(frame, "columns") else set().union(*rows) if rows else None
    specs = [((k,) if isinstance(k, str) else tuple(k), spec) for k, spec in columns.items()]
    if have is not None:
        for cols, _ in specs:
            missing = [c for c in cols if c not in have]
            if missing:
                raise ValueError(f"columns: {missing[0]!r} is not a column of the table")
    head = "".join(f"<th>{html.escape(header)}</th>" for _, (header, _f) in specs)
    body = []
    for row in rows:
        cells = []
        for cols, (_, fmt) in specs:
            value = fmt(*(row.get(c) for c in cols))
            cls = ' class="num"' if fmt in _NUMERIC else ""
            cells.append(f"<td{cls}>{html.escape(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(specs)}" class="muted">no rows</td></tr>')
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (
        f'<div class="table-wrap"><table class="report">{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def accuracy_pair(row: SettingRow | None) -> str:
    """Absolute accuracy of a setting and of its reference, from one audit row.

    The reference's score is ``score − accuracy_delta``: the delta is the paired
    difference relaxed − reference on the same items (THEORY §3), so it recovers the
    reference's mean on the items both runs answered.
    """
    if not row or _num(row.score) is None:
        return "–"
    out = pct(row.score)
    delta = _num(row.accuracy_delta)
    if delta is not None and not row.is_reference:
        out += f" (reference {pct(row.score - delta)})"
    return out
