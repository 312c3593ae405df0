"""The rejection anatomy of a task's ratio-test runs, as the ``summary.json`` block.

What the lossless ratio test throws away (THEORY §3 "Rejected-in-nucleus fraction" and
"Entropy gap"): per sampled run of the ratio-test rule (the registry's ``ratio_test``
entry, ``exact``), the share of its rejected drafts inside the target's θ nucleus for every
θ of the run's grid and in the target's top-k, the mean target and draft entropies at
those rejections, and, for every relaxed run judged against it, the target entropy where
that rule accepted a draft the ratio test rejected. The numbers are
:func:`~relaxspec_audit.audit.anatomy.rejection_anatomy`'s and
:func:`~relaxspec_audit.audit.anatomy.entropy_gaps`' on the run's own positions (shares:
Korn & Graubard interval clustered by request; means: CR1), only reshaped here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from relaxspec_audit.audit.results import AnatomyBlock, AnatomyRun, Entropies, ExtraAcceptance
from relaxspec_audit.audit.runs import TaskRuns, is_lossless, reference_rule
from relaxspec_audit.verify import registry

#: The θ the index quotes: the NSD paper's 52.6% is at θ = 0.95 (THEORY §3).
INDEX_THETA = 0.95

# Order of the splits in the block: the one a setting is chosen on, then the one it is
# judged on; other splits (or none) after.
_SPLIT_ORDER = ("discovery", "confirmation")

# Columns the statistics read (positions carry many more; each costs a decode per file).
_COLS = ("request_id", "kind", "cause", "passed_ratio", "accepted", "mass_above", "rank",
         "entropy_p", "entropy_q")  # fmt: skip


def ratio_test_rule() -> str:
    """The rule whose rejections are dissected: the registry's ratio test (``exact``)."""
    return next(name for name, spec in registry.RULES.items() if spec.ratio_test)


def anatomy_block(runs: TaskRuns, *, alpha: float = 0.05) -> AnatomyBlock:
    """The ``rejection_anatomy`` block of a task's ``summary.json`` (docs/REPORTS.md).

    One entry per sampled (T > 0) run of the ratio-test rule (replica runs left out, as
    everywhere in a report), discovery first, then confirmation; see
    :class:`~relaxspec_audit.audit.results.AnatomyRun` for the fields (``x ∈ N_θ ⇔
    mass_above < θ``, THEORY §2.3). ``note`` (else null) says why ``runs`` is empty or
    shorter than the task's ratio-test runs. Never raises for a task without such a run.
    """
    rule = ratio_test_rule()
    table = runs.table
    exact = table.filter((pl.col("rule") == rule) & (pl.col("temperature") > 0))
    if not exact.height:
        greedy_only = table.filter(pl.col("rule") == rule).height > 0
        note = (
            f"the {rule} runs decode at T = 0 only: no sampled ratio test to dissect"
            if greedy_only
            else f"no sampled {rule} run: nothing the ratio test rejected to dissect"
        )
        return AnatomyBlock(rule=rule, alpha=alpha, runs=[], note=note)
    rank = {s: i for i, s in enumerate(_SPLIT_ORDER)}
    rows = sorted(
        exact.iter_rows(named=True),
        key=lambda r: (rank.get(r["split"], len(rank)), str(r["split"]), r["run_id"] or ""),
    )
    # The relaxed runs judged against a ratio-test run: the report's pairing (THEORY §4).
    relaxed = [
        r
        for r in table.iter_rows(named=True)
        if not is_lossless(r["rule"]) and reference_rule(r["rule"], r["temperature"]) == rule
    ]
    entries, unlogged = [], []
    for row in rows:
        paired = [r for r in relaxed if runs.match(r, rule) == row["run_dir"]]
        entry = run_anatomy(runs, row["run_dir"], paired, split=row["split"], alpha=alpha)
        if entry is None:
            unlogged.append(f"{row['split'] or 'no split'} ({row['run_id']})")
            continue
        entries.append(entry)
    note = None
    if unlogged:
        note = (
            f"{rule} runs without position logs (collected with log_positions "
            f"off): {', '.join(unlogged)}"
        )
    return AnatomyBlock(rule=rule, alpha=alpha, runs=entries, note=note)


def run_anatomy(
    runs: TaskRuns,
    run_dir: str,
    paired: Sequence[Mapping[str, Any]] = (),
    *,
    split: str | None = None,
    alpha: float = 0.05,
) -> AnatomyRun | None:
    """One ratio-test run's entry of the block; None without positions.

    Args:
        runs: the task's runs.
        run_dir: the ratio-test run folder.
        paired: runs-table rows of the relaxed runs judged against it.
        split: its split.
        alpha: 1 − confidence level.
    """
    from relaxspec_audit.audit.anatomy import TOPK, entropy_gaps, rejection_anatomy
    from relaxspec_audit.audit.frames import RunFrames
    from relaxspec_audit.audit.pairing import with_position_unit

    frames = RunFrames.load([run_dir])
    pos = _positions(frames)
    if not pos.height:
        return None
    manifest = runs.manifest(run_dir)
    # Shares are clustered by request, or by item when items have several samples.
    pos, unit = with_position_unit(pos, frames.requests)
    anat = rejection_anatomy(pos, frames.theta_grid, TOPK, cluster=unit, alpha=alpha)
    nuc = anat.filter(pl.col("measure") == "nucleus")
    topk = anat.filter(pl.col("measure") == "topk")
    n_rej = int(nuc["n_rejected"][0]) if nuc.height else 0
    by_request = nuc
    if unit != "request_id" and nuc.height:  # its clusters are items: count requests
        one = rejection_anatomy(pos, frames.theta_grid[:1], (), alpha=alpha)
        by_request = one.filter(pl.col("measure") == "nucleus")
    keep = ["fraction", "ci_low", "ci_high"]
    extra = []
    for other in paired:
        other_frames = RunFrames.load([other["run_dir"]])
        rel, rel_unit = with_position_unit(_positions(other_frames), other_frames.requests)
        gaps = (_entropies(entropy_gaps(rel, cluster=rel_unit, alpha=alpha), "extra_accepted")
                if rel.height else None)  # fmt: skip
        extra.append(
            ExtraAcceptance(rule=other["rule"], setting=other["setting"], run_id=other["run_id"],
                            **(gaps or {"n_positions": None, "note": "no position logs"}))
        )  # fmt: skip
    return AnatomyRun(
        split=split,
        run_id=manifest.run_id,
        temperature=manifest.config.temperature,
        n_requests=int(frames.requests.select(pl.len()).collect().item()),
        n_rejections=n_rej,
        n_requests_with_rejections=int(by_request["n_clusters"][0]) if nuc.height else 0,
        in_nucleus=nuc.select("theta", *keep).to_dicts(),
        topk=topk.select("k", *keep).to_dicts(),
        entropy_at_rejections=Entropies(
            **_entropies(entropy_gaps(pos, cluster=unit, alpha=alpha), "rejected")
        ),
        extra_acceptances=extra,
        note=None if n_rej else "the ratio test rejected no draft: no anatomy to show",
    )


def _positions(frames: Any) -> pl.DataFrame:
    """The needed columns of the positions table, collected (empty: none logged)."""
    lf = frames.positions
    have = set(lf.collect_schema().names())
    return lf.select([c for c in _COLS if c in have]).collect()


def _entropies(gaps: pl.DataFrame, subset: str) -> dict[str, Any]:
    """``entropy_gaps`` rows of one subset as ``{entropy_p, entropy_q, gap, n_positions}``."""
    rows = {r["measure"]: r for r in gaps.to_dicts() if r["subset"] == subset}
    out: dict[str, Any] = {
        m: {k: rows[m][k] for k in ("mean", "ci_low", "ci_high")}
        for m in ("entropy_p", "entropy_q", "gap")
    }
    out["n_positions"] = rows["gap"]["n_positions"]
    return out
