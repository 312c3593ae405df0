"""What a sign-off says about speed: the modelled speed-ups, the wall clock, in words.

The verdict ranks and decides on the MODELLED speed-up (pass counts × one cost table, a
function of the logs; docs/STATISTICS.md §7). Beside it a reader needs two more facts: the
wall clock, labelled with how it was measured (a paired timing pass when the batch ran one,
else the collection's own, load-dependent timings), and whether speculation pays at all on
this pair, device and batch size — a relaxed rule that beats its lossless reference can
still be slower than plain target-only decoding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaxspec_audit.audit.records import Interval, Modelled, SpeedFacts, WallClock

#: Label of wall-clock speed-ups taken from the collection runs themselves.
COLLECTION_LABEL = (
    "wall clock of the collection runs (decoded at different times, so machine load moves "
    "it; not paired)"
)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def times(iv: Interval | None) -> str:
    """A speed-up with its interval in words: ``1.23× [1.10, 1.40]`` (``–``: unknown)."""
    if iv is None or iv.speedup is None:
        return "–"
    ci = "" if iv.ci_low is None or iv.ci_high is None else f" [{iv.ci_low:.2f}, {iv.ci_high:.2f}]"
    return f"{iv.speedup:.2f}×{ci}"


def speed_facts(
    row: Mapping[str, Any] | None,
    reference_row: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
    *,
    split: str | None = None,
) -> SpeedFacts:
    """The speed of a shown setting: modelled, wall clock (labelled) and in words.

    Args:
        row: the setting's audit-table row (confirmation split, else discovery).
        reference_row: the reference rule's own row (its speed-up over target-only).
        timing: the setting's entry of a paired timing pass
            (``{"speedup", "ci_low", "ci_high", "label"}``), when the batch ran one.
        split: the split the numbers are of.
    """
    row = row or {}
    modelled = Modelled(
        speedup=_num(row.get("speedup_vs_reference")),
        ci_low=_num(row.get("speedup_ci_low")),
        ci_high=_num(row.get("speedup_ci_high")),
        basis=row.get("speed_basis"),
        note=row.get("speed_note"),
    )

    def interval(source: Mapping[str, Any] | None) -> Interval | None:
        if not source or _num(source.get("speedup_vs_baseline")) is None:
            return None
        return Interval(speedup=_num(source["speedup_vs_baseline"]),
                        ci_low=_num(source.get("baseline_ci_low")),
                        ci_high=_num(source.get("baseline_ci_high")))  # fmt: skip

    vs_target, ref_vs_target = interval(row), interval(reference_row)
    wall = None
    if timing is not None and _num(timing.get("speedup")) is not None:
        wall = WallClock(
            speedup=_num(timing["speedup"]), ci_low=_num(timing.get("ci_low")),
            ci_high=_num(timing.get("ci_high")),
            label=str(timing.get("label") or "wall clock, paired timing pass"),
            kind="paired timing pass",  # on a sample of the discovery items
        )  # fmt: skip
    elif _num(row.get("wall_speedup_vs_reference")) is not None:
        wall = WallClock(
            speedup=_num(row["wall_speedup_vs_reference"]), ci_low=_num(row.get("wall_ci_low")),
            ci_high=_num(row.get("wall_ci_high")), label=COLLECTION_LABEL,
            kind="collection runs, unpaired",
        )  # fmt: skip
    return SpeedFacts(
        modelled=modelled,
        vs_target=vs_target,
        reference_vs_target=ref_vs_target,
        wall_clock=wall,
        sentence=speculation_sentence(vs_target, ref_vs_target),
        split=split,
    )


def speculation_sentence(vs_target: Interval | None, reference_vs_target: Interval | None) -> str:
    """Whether speculation pays over target-only decoding here, in one or two sentences."""
    if vs_target is None:
        return (
            "Speed over target-only decoding is unknown: no target-only run or no cost "
            "table to model it."
        )
    lo, hi = vs_target.ci_low, vs_target.ci_high
    if hi is not None and hi < 1.0:
        out = (
            f"Speculation does not pay on this pair, device and batch size: this setting "
            f"decodes at {times(vs_target)} the speed of target-only decoding (modelled), so "
            "plain decoding is faster whatever the verdict on fidelity."
        )
    elif lo is not None and lo > 1.0:
        out = f"Speculation pays here: {times(vs_target)} over target-only decoding (modelled)."
    else:
        out = (
            f"Not shown faster than target-only decoding: {times(vs_target)} (modelled); "
            "the interval includes 1."
        )
    if reference_vs_target is not None:
        out += f" The lossless reference alone runs at {times(reference_vs_target)}."
    return out


def _timing_records(runs_dir: str | Path) -> list[dict[str, Any]]:
    """The readable ``timing/*.json`` records under a runs root (local or on a store)."""
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
        "label": "; ".join(x for x in (str(row["label"]), row["warning"]) if x),
        "timing_id": rec.get("id"),
    }
