"""The rejection anatomy of a task's ``exact`` runs, as the ``summary.json`` block.

What the lossless ratio test throws away (THEORY §3 "Rejected-in-nucleus fraction" and
"Entropy gap"): per sampled ``exact`` run, the share of its rejected drafts inside the
target's θ nucleus for every θ of the run's grid and in the target's top-k, the mean
target and draft entropies at those rejections, and, for every relaxed run judged
against it, the target entropy where that rule accepted a draft the ratio test rejected.
The numbers are :func:`~relaxspec_audit.audit.anatomy.rejection_anatomy`'s and
:func:`~relaxspec_audit.audit.anatomy.entropy_gaps`' on the run's own positions (shares:
Korn & Graubard interval clustered by request; means: CR1), only reshaped here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit.report.format import pct
from relaxspec_audit.report.jsonio import _jsonable

#: The rule whose rejections are dissected: the ratio test ``u < min(1, p/q)`` of THEORY
#: §2.1 (``greedy``'s ``passed_ratio`` is an argmax match, not a ratio test).
RATIO_TEST_RULE = "exact"

#: The θ the index quotes: the NSD paper's 52.6% is at θ = 0.95 (THEORY §3).
INDEX_THETA = 0.95

# Order of the splits in the block: the one a setting is chosen on, then the one it is
# judged on; other splits (or none) after.
_SPLIT_ORDER = ("discovery", "confirmation")

# Columns the statistics read (positions carry many more; each costs a decode per file).
_COLS = ("request_id", "kind", "cause", "passed_ratio", "accepted", "mass_above", "rank",
         "entropy_p", "entropy_q")  # fmt: skip


def anatomy_block(runs_dir: str | Path, task: str, *, alpha: float = 0.05) -> dict[str, Any]:
    """The ``rejection_anatomy`` block of a task's ``summary.json`` (docs/REPORTS.md).

    One entry per sampled (T > 0) ``exact`` run of the task (replica runs left out, as
    everywhere in a report), discovery first, then confirmation. Each entry: ``split,
    run_id, temperature, n_requests, n_rejections, n_requests_with_rejections``;
    ``in_nucleus`` (``{theta, fraction, ci_low, ci_high}`` per θ of the run's logged grid,
    ``x ∈ N_θ ⇔ mass_above < θ``, THEORY §2.3); ``topk`` (``{k, fraction, ci_low,
    ci_high}`` for k in :data:`~relaxspec_audit.audit.anatomy.TOPK`);
    ``entropy_at_rejections`` (``entropy_p``, ``entropy_q`` and ``gap`` = H(q) − H(p),
    each ``{mean, ci_low, ci_high}`` in nats, and ``n_positions``); and
    ``extra_acceptances``: per relaxed run paired with it (same items, seed and
    sampling, THEORY §4), the same three means over the positions that rule accepted
    although the ratio test failed (THEORY §3 "Entropy gap"). Shares carry the Korn &
    Graubard interval, means the CR1 interval, both clustered by request at level
    ``1 − alpha``.

    Args:
        runs_dir: folder of run folders.
        task: task name.
        alpha: 1 − confidence level.

    Returns:
        ``{"rule", "alpha", "runs": [...], "note"}``; ``note`` (else null) says why
        ``runs`` is empty or shorter than the task's ``exact`` runs: no sampled ``exact``
        run, or runs collected without position logs. Never raises for a task that has
        no such run.
    """
    import polars as pl

    from relaxspec_audit.report.runs import LOSSLESS, _match, reference_rule, runs_table

    table = runs_table(runs_dir, task)
    exact = table.filter((pl.col("rule") == RATIO_TEST_RULE) & (pl.col("temperature") > 0))
    block: dict[str, Any] = {"rule": RATIO_TEST_RULE, "alpha": alpha, "runs": [], "note": None}
    if not exact.height:
        greedy_only = table.filter(pl.col("rule") == RATIO_TEST_RULE).height > 0
        block["note"] = (
            f"the {RATIO_TEST_RULE} runs decode at T = 0 only: no sampled ratio test to dissect"
            if greedy_only
            else f"no sampled {RATIO_TEST_RULE} run: nothing the ratio test rejected to dissect"
        )
        return block
    rank = {s: i for i, s in enumerate(_SPLIT_ORDER)}
    rows = sorted(
        exact.iter_rows(named=True),
        key=lambda r: (rank.get(r["split"], len(rank)), str(r["split"]), r["run_id"] or ""),
    )
    # The relaxed runs judged against an exact run: the report's own pairing (THEORY §4).
    relaxed = [
        r
        for r in table.iter_rows(named=True)
        if r["rule"] not in LOSSLESS
        and reference_rule(r["rule"], r["temperature"]) == RATIO_TEST_RULE
    ]
    unlogged = []
    for row in rows:
        paired = [r for r in relaxed if _match(table, r, RATIO_TEST_RULE) == row["run_dir"]]
        entry = run_anatomy(row["run_dir"], paired, alpha=alpha)
        if entry is None:
            unlogged.append(f"{row['split'] or 'no split'} ({row['run_id']})")
            continue
        block["runs"].append({"split": row["split"], **entry})
    if unlogged:
        block["note"] = (
            f"{RATIO_TEST_RULE} runs without position logs (collected with log_positions "
            f"off): {', '.join(unlogged)}"
        )
    return _jsonable(block)


def run_anatomy(
    run_dir: str | Path, paired: Sequence[Mapping[str, Any]] = (), *, alpha: float = 0.05
) -> dict[str, Any] | None:
    """One ``exact`` run's entry of the block (see :func:`anatomy_block`); None without positions.

    Args:
        run_dir: the ``exact`` run folder.
        paired: ``runs_table`` rows of the relaxed runs judged against it (their
            ``rule``, ``setting``, ``run_id``, ``run_dir``).
        alpha: 1 − confidence level.
    """
    import polars as pl

    from relaxspec_audit.audit.anatomy import TOPK, entropy_gaps, rejection_anatomy
    from relaxspec_audit.audit.frames import RunFrames

    frames = RunFrames.load([run_dir])
    pos = _positions(frames)
    if not pos.height:
        return None
    manifest = frames.manifests[0]
    anat = rejection_anatomy(pos, frames.theta_grid, TOPK, alpha=alpha)
    nuc = anat.filter(pl.col("measure") == "nucleus")
    topk = anat.filter(pl.col("measure") == "topk")
    n_rej = int(nuc["n_rejected"][0]) if nuc.height else 0
    keep = ["fraction", "ci_low", "ci_high"]
    entry: dict[str, Any] = {
        "run_id": manifest.get("run_id"),
        "temperature": (manifest.get("config") or {}).get("temperature"),
        "n_requests": int(frames.requests.select(pl.len()).collect().item()),
        "n_rejections": n_rej,
        "n_requests_with_rejections": int(nuc["n_clusters"][0]) if nuc.height else 0,
        "in_nucleus": nuc.select("theta", *keep).to_dicts(),
        "topk": topk.select("k", *keep).to_dicts(),
        "entropy_at_rejections": _entropies(entropy_gaps(pos, alpha=alpha), "rejected"),
        "extra_acceptances": [],
        "note": None if n_rej else "the ratio test rejected no draft: no anatomy to show",
    }
    for other in paired:
        rel = _positions(RunFrames.load([other["run_dir"]]))
        extra = _entropies(entropy_gaps(rel, alpha=alpha), "extra_accepted") if rel.height else None
        entry["extra_acceptances"].append(
            {"rule": other["rule"], "setting": other["setting"], "run_id": other["run_id"],
             **(extra or {"n_positions": None, "note": "no position logs"})}
        )  # fmt: skip
    return entry


def _positions(frames: Any) -> Any:
    """The needed columns of the positions table, collected (empty: none logged)."""
    lf = frames.positions
    have = set(lf.collect_schema().names())
    return lf.select([c for c in _COLS if c in have]).collect()


def _entropies(gaps: Any, subset: str) -> dict[str, Any]:
    """``entropy_gaps`` rows of one subset as ``{entropy_p, entropy_q, gap, n_positions}``."""
    rows = {r["measure"]: r for r in gaps.to_dicts() if r["subset"] == subset}
    out: dict[str, Any] = {
        m: {k: rows[m][k] for k in ("mean", "ci_low", "ci_high")}
        for m in ("entropy_p", "entropy_q", "gap")
    }
    out["n_positions"] = rows["gap"]["n_positions"]
    return out


def anatomy_line(summary: Mapping[str, Any], theta: float = INDEX_THETA) -> str | None:
    """One line for the index: ``exact rejections inside the θ=0.95 nucleus: 41% [35, 47]``.

    From the confirmation run when the block has one (where a verdict is judged), else
    the first run; None when no run logged a share at ``theta``.
    """
    runs = (summary.get("rejection_anatomy") or {}).get("runs") or []
    runs = sorted(runs, key=lambda r: r.get("split") != "confirmation")
    for run in runs:
        for row in run.get("in_nucleus") or []:
            if row.get("theta") is not None and abs(row["theta"] - theta) < 1e-9:
                where = f" ({run['split']})" if run.get("split") else ""
                share = pct(row.get("fraction"), row.get("ci_low"), row.get("ci_high"))
                inside = f"rejections inside the θ={theta:g} nucleus"
                return f"{RATIO_TEST_RULE} {inside}{where}: {share}"
    return None
