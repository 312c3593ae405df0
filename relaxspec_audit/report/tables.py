"""Exports of a summary as flat tables: CSV for spreadsheets, markdown for a review thread.

Two record types are flattened, each into one fixed list of columns so that a file's
header never depends on the data:

- an ``audit_summary`` dict (``relaxspec-audit audit --format csv|md``): one row per
  audited selection (:data:`AUDIT_COLUMNS`);
- a task audit (``summary.json``; the batch writes ``summary.csv`` beside it): one row
  per relaxed rule family (:data:`FAMILY_COLUMNS`).

CSV cells hold the raw numbers (an interval is two columns, ``*_ci_low`` and
``*_ci_high``, empty when unknown); markdown shows them formatted, an interval as
``est [low, high]``, every text cell made inert by :func:`~.format._md`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit.audit.records import Interval
from relaxspec_audit.audit.results import TaskAudit
from relaxspec_audit.report.format import _md

__all__ = [
    "AUDIT_COLUMNS",
    "FAMILY_COLUMNS",
    "audit_markdown",
    "audit_rows",
    "family_rows",
    "rows_csv",
    "rows_markdown",
    "write_summary_csv",
]

#: Columns of :func:`audit_rows`. ``acceptance_rate`` is α = Σ accepted / Σ reached
#: (docs/STATISTICS.md §7), the figure ``collect`` prints under the same name.
AUDIT_COLUMNS = (
    "task", "rule", "setting", "params", "runs", "reference", "reference_runs", "target",
    "draft", "n_requests", "n_positions", "acceptance_rate", "tau_mean", "tau_ci_low",
    "tau_ci_high", "speedup_vs_reference", "speedup_ci_low", "speedup_ci_high",
    "speed_basis", "wall_speedup_vs_reference", "wall_ci_low", "wall_ci_high",
    "speedup_vs_baseline", "baseline_ci_low", "baseline_ci_high", "accuracy_delta",
    "delta_ci_low", "delta_ci_high", "ni_margin", "p_noninferiority", "noninferior",
    "n_items", "divergence", "divergence_ci_low", "divergence_ci_high", "n_diverged",
    "verified",
)  # fmt: skip

#: Columns of :func:`family_rows` (one row per relaxed rule family of a task).
FAMILY_COLUMNS = (
    "task", "rule", "reference", "verdict", "setting", "chosen", "split", "speedup",
    "speedup_ci_low", "speedup_ci_high", "wall_speedup", "wall_ci_low", "wall_ci_high",
    "accuracy_delta", "delta_ci_low", "delta_ci_high", "divergence", "divergence_ci_low",
    "divergence_ci_high", "n_items", "noise_floor", "reason",
)  # fmt: skip

# Column groups shown as one "est [low, high]" cell in markdown.
_INTERVALS = {
    "tau_mean": ("tau_ci_low", "tau_ci_high"),
    "speedup_vs_reference": ("speedup_ci_low", "speedup_ci_high"),
    "wall_speedup_vs_reference": ("wall_ci_low", "wall_ci_high"),
    "speedup_vs_baseline": ("baseline_ci_low", "baseline_ci_high"),
    "speedup": ("speedup_ci_low", "speedup_ci_high"),
    "wall_speedup": ("wall_ci_low", "wall_ci_high"),
    "accuracy_delta": ("delta_ci_low", "delta_ci_high"),
    "divergence": ("divergence_ci_low", "divergence_ci_high"),
}


def _get(d: Mapping[str, Any] | None, *keys: str) -> Any:
    """``d[k1][k2]…``, None where any level is missing."""
    for key in keys:
        if not isinstance(d, Mapping):
            return None
        d = d.get(key)
    return d


def audit_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row of :data:`AUDIT_COLUMNS` for an ``audit_summary`` dict (schema 3).

    Names what was audited (task, rule with resolved params, reference run ids, models)
    and the headline numbers: acceptance rate, τ, the modelled and wall-clock speed-ups,
    the paired accuracy delta and the hash divergence, each with its interval.
    """
    rule = summary.get("rule") or {}
    ref = summary.get("reference") or {}
    sp = summary.get("speedup_vs_reference") or {}
    wall = summary.get("wall_speedup_vs_reference") or {}
    base = summary.get("speedup_vs_baseline") or {}
    acc = summary.get("accuracy_delta") or {}
    hd = summary.get("hash_divergence") or {}
    tau_ci = summary.get("tau_ci") or [None, None]
    row = {
        "task": summary.get("task") or " ".join(summary.get("tasks") or []) or None,
        "rule": rule.get("name") or " ".join(summary.get("rules") or []) or None,
        "setting": rule.get("label"),
        "params": json.dumps(rule["params"], sort_keys=True) if "params" in rule else None,
        "runs": " ".join(map(str, summary.get("runs") or [])) or None,
        "reference": _get(ref, "rule", "label"),
        "reference_runs": " ".join(map(str, ref.get("runs") or [])) or None,
        "target": _get(summary, "models", "target", "path"),
        "draft": _get(summary, "models", "draft", "path"),
        "n_requests": summary.get("n_requests"),
        "n_positions": summary.get("n_positions"),
        "acceptance_rate": summary.get("acceptance_rate"),
        "tau_mean": summary.get("tau_mean"),
        "tau_ci_low": tau_ci[0],
        "tau_ci_high": tau_ci[1],
        "speedup_vs_reference": sp.get("speedup"),
        "speedup_ci_low": sp.get("ci_low"),
        "speedup_ci_high": sp.get("ci_high"),
        "speed_basis": sp.get("basis"),
        "wall_speedup_vs_reference": wall.get("speedup"),
        "wall_ci_low": wall.get("ci_low"),
        "wall_ci_high": wall.get("ci_high"),
        "speedup_vs_baseline": base.get("speedup"),
        "baseline_ci_low": base.get("ci_low"),
        "baseline_ci_high": base.get("ci_high"),
        "accuracy_delta": acc.get("delta"),
        "delta_ci_low": acc.get("ci_low"),
        "delta_ci_high": acc.get("ci_high"),
        "ni_margin": acc.get("ni_margin"),
        "p_noninferiority": acc.get("p_noninferiority"),
        "noninferior": acc.get("noninferior"),
        "n_items": acc.get("n_items"),
        "divergence": hd.get("rate"),
        "divergence_ci_low": hd.get("ci_low"),
        "divergence_ci_high": hd.get("ci_high"),
        "n_diverged": hd.get("n_diverged"),
        "verified": summary.get("verified"),
    }
    return [row]


def family_rows(audit: TaskAudit) -> list[dict[str, Any]]:
    """One row of :data:`FAMILY_COLUMNS` per relaxed rule family of a task audit.

    The numbers are those the sign-off shows beside the verdict: the shown setting's
    modelled speed-up over the reference (``speed.modelled``), the wall clock (the
    paired timing pass when there was one, else the collection's), the accuracy delta
    and divergence on the split the speed is shown for, the items the confirmation test
    used, the noise floor's short form and the verdict's reasons.
    """
    out = []
    for fam in audit.families:
        speed = fam.speed
        split = speed.split or "confirmation"
        row = getattr(fam, split, None) or fam.confirmation or fam.discovery
        modelled = speed.modelled
        wall: Any = speed.wall_clock
        if wall is None or wall.speedup is None:
            wall = Interval(
                speedup=row.wall_speedup_vs_reference if row else None,
                ci_low=row.wall_ci_low if row else None,
                ci_high=row.wall_ci_high if row else None,
            )
        numbers = fam.select.numbers if fam.select is not None else None
        tested = getattr(numbers, split, None) if numbers is not None else None
        n_items = getattr(tested, "n_items", None)
        floor = fam.noise_floor
        out.append(
            {
                "task": audit.task,
                "rule": fam.rule,
                "reference": fam.reference,
                "verdict": fam.verdict,
                "setting": fam.setting or fam.shown_setting,
                "chosen": fam.setting is not None,
                "split": split if row else None,
                "speedup": modelled.speedup,
                "speedup_ci_low": modelled.ci_low,
                "speedup_ci_high": modelled.ci_high,
                "wall_speedup": wall.speedup,
                "wall_ci_low": wall.ci_low,
                "wall_ci_high": wall.ci_high,
                "accuracy_delta": row.accuracy_delta if row else None,
                "delta_ci_low": row.delta_ci_low if row else None,
                "delta_ci_high": row.delta_ci_high if row else None,
                "divergence": row.divergence if row else None,
                "divergence_ci_low": row.divergence_ci_low if row else None,
                "divergence_ci_high": row.divergence_ci_high if row else None,
                "n_items": n_items if n_items is not None else (row.n_requests if row else None),
                "noise_floor": getattr(floor, "short", None),
                "reason": "; ".join(fam.reasons) or None,
            }
        )
    return out


def _cell(value: Any) -> Any:
    """A CSV cell: empty for None, ``true``/``false`` for booleans, else the value."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def rows_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as CSV text with a header of ``columns`` (RFC 4180 quoting, one line per row)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def _num(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return _md(value)


def _shown(row: Mapping[str, Any], columns: Sequence[str]) -> list[tuple[str, str]]:
    """``(column, text)`` pairs, an interval's bounds folded into its estimate's cell."""
    pairs = {c: _INTERVALS[c] for c in columns if c in _INTERVALS}
    pairs = {c: p for c, p in pairs.items() if all(b in columns for b in p)}
    folded = {b for p in pairs.values() for b in p}
    out = []
    for col in columns:
        if col in folded:
            continue
        text = _num(row.get(col))
        if col in pairs and row.get(pairs[col][0]) is not None:
            low, high = pairs[col]
            text += f" [{_num(row.get(low))}, {_num(row.get(high))}]"
        out.append((col, text))
    return out


def rows_markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as a markdown table, an interval shown as ``est [low, high]`` in one cell."""
    if not rows:
        return "_no rows_\n"
    cells = [_shown(r, columns) for r in rows]
    header = [c for c, _ in cells[0]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(text for _, text in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def audit_markdown(summary: Mapping[str, Any]) -> str:
    """An ``audit_summary`` as a two-column markdown table (quantity, value with CI)."""
    (row,) = audit_rows(summary)
    lines = ["| quantity | value |", "|---|---|"]
    lines += [f"| {col} | {text} |" for col, text in _shown(row, AUDIT_COLUMNS)]
    return "\n".join(lines) + "\n"


def write_summary_csv(audit: TaskAudit, path: str | Path) -> Path:
    """Write :func:`family_rows` of a task audit as CSV at ``path``, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = rows_csv(family_rows(audit), FAMILY_COLUMNS)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
