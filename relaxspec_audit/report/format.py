"""Short text of report numbers: values, settings, percentages, intervals, timestamps.

Shared by the HTML index (:mod:`.export`), the notebook markdown (:mod:`.markdown`) and
the run labels (:mod:`.runs`), so a number reads the same on every page.
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
