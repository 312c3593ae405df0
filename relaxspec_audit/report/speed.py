"""What a sign-off says about speed: the modelled speed-ups, the wall clock, in words.

The verdict ranks and decides on the MODELLED speed-up (pass counts × one cost table, a
function of the logs; docs/STATISTICS.md §7). Beside it a reader needs two more facts: the
wall clock, labelled with how it was measured (a paired timing pass when the batch ran one,
else the collection's own, load-dependent timings), and whether speculation pays at all on
this pair, device and batch size — a relaxed rule that beats its lossless reference can
still be slower than plain target-only decoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaxspec_audit.report.format import _iv

#: Label of wall-clock speed-ups taken from the collection runs themselves.
COLLECTION_LABEL = (
    "wall clock of the collection runs (decoded at different times, so machine load moves "
    "it; not paired)"
)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _interval(s: Any, lo: Any, hi: Any) -> dict[str, float | None]:
    return {"speedup": _num(s), "ci_low": _num(lo), "ci_high": _num(hi)}


def speed_facts(
    row: Mapping[str, Any] | None,
    reference_row: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The speed of a shown setting: modelled, wall clock (labelled) and in words.

    Args:
        row: the setting's ``audit_table`` row (confirmation split, else discovery).
        reference_row: the reference rule's own row (its speed-up over target-only).
        timing: the setting's entry of a paired timing pass
            (``{"speedup", "ci_low", "ci_high", "label"}``), when the batch ran one.

    Returns:
        ``{"modelled": {speedup, ci_low, ci_high, basis}, "vs_target": {...} | None,
        "reference_vs_target": {...} | None, "wall_clock": {speedup, ci_low, ci_high,
        label, kind} | None, "sentence": str}`` (``kind``: the short name of how the wall
        clock was measured, ``label``: the full one).
    """
    row = row or {}
    modelled = _interval(
        row.get("speedup_vs_reference"), row.get("speedup_ci_low"), row.get("speedup_ci_high")
    )
    modelled["basis"] = row.get("speed_basis")
    modelled["note"] = row.get("speed_note")
    vs_target = None
    if _num(row.get("speedup_vs_baseline")) is not None:
        vs_target = _interval(
            row["speedup_vs_baseline"], row.get("baseline_ci_low"), row.get("baseline_ci_high")
        )
    ref_vs_target = None
    if reference_row and _num(reference_row.get("speedup_vs_baseline")) is not None:
        ref_vs_target = _interval(
            reference_row["speedup_vs_baseline"],
            reference_row.get("baseline_ci_low"),
            reference_row.get("baseline_ci_high"),
        )
    if timing is not None and _num(timing.get("speedup")) is not None:
        wall = _interval(timing["speedup"], timing.get("ci_low"), timing.get("ci_high"))
        wall["label"] = str(timing.get("label") or "wall clock, paired timing pass")
        wall["kind"] = "paired timing pass"  # on a sample of the discovery items
    elif _num(row.get("wall_speedup_vs_reference")) is not None:
        wall = _interval(row["wall_speedup_vs_reference"], row.get("wall_ci_low"),
                         row.get("wall_ci_high"))  # fmt: skip
        wall["label"] = COLLECTION_LABEL
        wall["kind"] = "collection runs, unpaired"
    else:
        wall = None
    return {
        "modelled": modelled,
        "vs_target": vs_target,
        "reference_vs_target": ref_vs_target,
        "wall_clock": wall,
        "sentence": speculation_sentence(vs_target, ref_vs_target),
    }


def speculation_sentence(
    vs_target: Mapping[str, Any] | None, reference_vs_target: Mapping[str, Any] | None
) -> str:
    """Whether speculation pays over target-only decoding here, in one or two sentences."""
    if vs_target is None:
        return (
            "Speed over target-only decoding is unknown: no target-only run or no cost "
            "table to model it."
        )
    lo, hi = vs_target.get("ci_low"), vs_target.get("ci_high")
    if hi is not None and hi < 1.0:
        out = (
            f"Speculation does not pay on this pair, device and batch size: this setting "
            f"decodes at {_iv(vs_target)} the speed of target-only decoding (modelled), so "
            "plain decoding is faster whatever the verdict on fidelity."
        )
    elif lo is not None and lo > 1.0:
        out = f"Speculation pays here: {_iv(vs_target)} over target-only decoding (modelled)."
    else:
        out = (
            f"Not shown faster than target-only decoding: {_iv(vs_target)} (modelled); "
            "the interval includes 1."
        )
    if reference_vs_target is not None:
        out += f" The lossless reference alone runs at {_iv(reference_vs_target)}."
    return out


def _timing_records(runs_dir: str | Path) -> list[dict[str, Any]]:
    """The readable ``timing/*.json`` records under a runs root (local or on a store)."""
    import json

    from relaxspec_audit.collect import storage

    if not storage.is_remote(runs_dir):
        folder = Path(runs_dir) / "timing"
        out = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out
    store = storage.parse_store(runs_dir)
    names = sorted(n for n in storage.list_files(store, "timing") if n.endswith(".json"))
    out = []
    for name in names:
        if "/" in name:  # the local glob reads only timing/*.json, not subfolders
            continue
        try:
            rec = storage.read_json(store, "timing", name)
        except storage.LogError:
            continue  # unreadable, as a local one is skipped
        if rec is not None:
            out.append(rec)
    return out


def timing_for(
    runs_dir: str | Path, reference_run: str, candidate_run: str, *, alpha: float = 0.05
) -> dict[str, Any] | None:
    """The candidate's wall-clock speed-up over the reference from a stored timing pass.

    Reads ``<runs_dir>/timing/*.json`` (written by ``relaxspec-audit time`` or the batch's
    timing step) and takes the latest record that timed both run ids.

    Returns:
        ``{"speedup", "ci_low", "ci_high", "label", "timing_id"}``, or None when no record
        timed the two runs.
    """
    from relaxspec_audit.audit.walltime import timing_speedups

    found = []
    for rec in _timing_records(runs_dir):
        ids = rec.get("run_ids") or []
        if reference_run in ids and candidate_run in ids:
            found.append(rec)
    if not found:
        return None
    rec = max(found, key=lambda r: str(r.get("started_at", "")))
    rows = timing_speedups(rec, reference=rec["run_ids"].index(reference_run), alpha=alpha)
    hit = [r for r in rows.iter_rows(named=True) if r["run_id"] == candidate_run]
    if not hit:
        return None
    row = hit[0]
    return {
        "speedup": _num(row["speedup"]),
        "ci_low": _num(row["ci_low"]),
        "ci_high": _num(row["ci_high"]),
        "label": str(row["label"]),
        "timing_id": rec.get("id"),
    }
