"""The audit summary: every statistic of THEORY §3 for a run as one JSON-ready dict.

The dict (keys in docs/STATISTICS.md, versioned by :data:`AUDIT_SCHEMA_VERSION`) is what
the ``audit`` command prints, the notebooks show and the batch runner reads. Positions
are read once (only the needed columns) and every statistic of
:mod:`relaxspec_audit.audit` runs on that frame.

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import polars as pl

from relaxspec_audit.audit.accuracy import accuracy_delta
from relaxspec_audit.audit.anatomy import (
    DEFAULT_THETA_GRID,
    SUBSETS,
    TOPK,
    entropy_gaps,
    rejection_anatomy,
)
from relaxspec_audit.audit.counterfactual import counterfactual_nsd
from relaxspec_audit.audit.fidelity import (
    deviation_accounting,
    deviation_by_position,
    es_index,
    flatten_es,
    hash_divergence,
)
from relaxspec_audit.audit.frames import (
    CLUSTER,
    Frame,
    RunFrames,
    _lazy,
    _manifest_grid,
    _records,
    json_safe,
    nsd_theta,
)
from relaxspec_audit.audit.pairing import with_position_unit
from relaxspec_audit.audit.runs import cost_warnings_of
from relaxspec_audit.audit.select import (
    COST_NOTE,
    COST_TABLE,
    PASS_COST,
    pass_cost,
    requests_speedup,
)
from relaxspec_audit.audit.speedup import (
    acceptance_by_position,
    modelled_speedup_paired,
    paired_speedup,
    speed,
)
from relaxspec_audit.collect.costs import flagged_note
from relaxspec_audit.collect.manifest import RunManifest, priced_alike
from relaxspec_audit.verify.params import bad_thetas
from relaxspec_audit.verify.registry import RULES

#: Version of the JSON written by :func:`audit_summary` (docs/STATISTICS.md lists the keys).
#: 3: ``speedup_vs_reference`` / ``speedup_vs_baseline`` are the modelled speed-ups (pass
#: counts × cost table); the collection's wall clock moved to ``wall_speedup_vs_*``.
AUDIT_SCHEMA_VERSION = 3


# Columns audit_summary reads from rounds / requests (prompt_ids, text, … are skipped:
# with a writer's many small parts, every extra column costs a decode per file).
_ROUND_COLS = ("run_id", "request_id", "k", "accepted", "emitted", "draft_s", "verify_s")
_REQUEST_COLS = ("run_id", "request_id", "item_id", "task", "split", "output_ids",
                 "output_sha256", "n_tokens", "target_passes", "wall_s", "score")  # fmt: skip


def _modelled(
    rel_req: pl.DataFrame,
    rel: RunFrames,
    ref_req: pl.DataFrame,
    ref: RunFrames,
    *,
    alpha: float,
    same_kind: bool,
) -> dict[str, Any]:
    """The modelled speed-up of one run over another (STATISTICS §7), JSON-ready.

    With one manifest on each side, :func:`modelled_speedup_paired` (its cost tables, a
    note when they differ). Without cost tables, two speculative runs of one pair and K
    (``same_kind``: a relaxed run and its reference) still compare by tokens per pass, the
    pass cost cancelling (``basis: passes``); across kinds of pass there is no estimate.
    """
    if len(rel.manifests) == 1 and len(ref.manifests) == 1:
        row = modelled_speedup_paired(None, rel_req, rel.manifests[0], None, ref_req,
                                      ref.manifests[0], alpha=alpha).row(0, named=True)  # fmt: skip
        if row["speedup"] is not None:
            return {**row, "basis": "cost table"}  # its note says when the tables differ
    out = requests_speedup(
        _with_costs(rel_req, rel), _with_costs(ref_req, ref), alpha=alpha,
        need_costs=not same_kind,
    )  # fmt: skip
    return out


def _with_costs(requests: pl.DataFrame, frames: RunFrames) -> pl.DataFrame:
    """``requests`` with each run's cost of a target pass and its table id (null: none)."""
    costs = {m.run_id: pass_cost(m) for m in frames.manifests}
    ids = {m.run_id: m.cost_table.id if m.cost_table else None for m in frames.manifests}
    notes = {m.run_id: flagged_note(m.cost_table.warnings) if m.cost_table else None
             for m in frames.manifests}  # fmt: skip
    if "run_id" not in requests.columns:
        return requests.with_columns(
            pl.lit(None, pl.Float64).alias(PASS_COST),
            pl.lit(None, pl.String).alias(COST_TABLE),
            pl.lit(None, pl.String).alias(COST_NOTE),
        )
    rid = pl.col("run_id")
    return requests.with_columns(
        rid.replace_strict(costs, default=None, return_dtype=pl.Float64).alias(PASS_COST),
        rid.replace_strict(ids, default=None, return_dtype=pl.String).alias(COST_TABLE),
        rid.replace_strict(notes, default=None, return_dtype=pl.String).alias(COST_NOTE),
    )


def _identity(manifests: Sequence[RunManifest]) -> dict[str, Any]:
    """What was audited, from the manifests: task, rule with resolved params, models.

    The rule's parameters are the manifests' resolved ones (``params_dict``), so ``{}`` and
    ``{"theta": 0.95}`` name one setting. A value the runs do not share is null (``tasks``
    lists every task).
    """
    from relaxspec_audit.verify import registry

    def one(values: Iterable[Any]) -> Any:
        distinct = {json.dumps(v, sort_keys=True, default=str) for v in values}
        return json.loads(distinct.pop()) if len(distinct) == 1 else None

    rules = [
        {"name": m.rule, "params": registry.params_dict(m.params), "label": m.label}
        for m in manifests
    ]
    models = []
    for m in manifests:
        found = m.models
        models.append(
            {
                role: {
                    k: (found.get(role) or {}).get(k) for k in ("path", "config_sha256", "n_params")
                }
                for role in ("target", "draft")
            }
        )
    return {
        "task": one(m.config.task for m in manifests),
        "tasks": sorted({m.config.task for m in manifests}),
        "rule": one(rules),
        "models": one(models),
    }


def _needed(frame: Frame, name: str, cols: Sequence[str]) -> pl.DataFrame:
    """Collect the columns of ``cols`` that exist (``request_id`` is required)."""
    lf = _lazy(frame, name, ["request_id"])
    have = set(lf.collect_schema().names())
    return lf.select([c for c in cols if c in have]).collect().rechunk()


def _priced_alike(*sides: RunFrames | None) -> list[RunFrames | None]:
    """The frames with every run priced by the one table of its key (``priced_alike``)."""
    every = [m for side in sides if side is not None for m in side.manifests]
    priced = iter(priced_alike(every))
    return [None if side is None else dataclasses.replace(
        side, manifests=[next(priced) for _ in side.manifests]) for side in sides]  # fmt: skip


def audit_summary(
    runs: RunFrames | str | Path | Iterable[str | Path],
    *,
    reference: RunFrames | str | Path | Iterable[str | Path] | None = None,
    baseline: RunFrames | str | Path | Iterable[str | Path] | None = None,
    theta_grid: Sequence[float] | None = None,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    correction: Literal["holm", "fdr_bh"] = "holm",
    verify: bool = True,
) -> dict[str, Any]:
    """All audit statistics of THEORY §3 as a JSON-ready dict (keys: docs/STATISTICS.md).

    Positions are read once (only the needed columns) and every statistic runs on that
    frame. With a ``reference`` run (``exact`` for NSD, strict ``greedy`` for ASD) the
    paired statistics are added: ``accuracy_delta``, ``hash_divergence``,
    ``speedup_vs_reference`` and the identical-output rate in ``deviation``. With a
    ``baseline`` (target-only) run, ``speedup_vs_baseline``.

    Args:
        runs: run folders / a parent folder, or :class:`RunFrames`.
        reference: the reference run(s), same forms.
        baseline: the target-only run(s), same forms.
        theta_grid: θ grid for the rejection anatomy and counterfactual (default: the
            runs' ``es`` grid from the manifest, else :data:`DEFAULT_THETA_GRID`).
        ni_margin: non-inferiority margin δ on the score scale.
        alpha: 1 − confidence level.
        correction: ``holm`` or ``fdr_bh`` across tasks.
        verify: check every run's commit records and value ranges on read (run folders
            given as paths; :class:`RunFrames` carry their own verification).

    Returns:
        A dict with ``schema_version`` = :data:`AUDIT_SCHEMA_VERSION`; see docs/STATISTICS.md.
    """

    def frames(x):
        return x if isinstance(x, RunFrames) or x is None else RunFrames.load(x, verify=verify)

    runs, reference, baseline = _priced_alike(frames(runs), frames(reference), frames(baseline))
    es_grid = _manifest_grid(runs.manifests)
    grid = tuple(theta_grid) if theta_grid else (es_grid or DEFAULT_THETA_GRID)
    if bad := bad_thetas(grid):
        raise ValueError(f"theta_grid: values must be in (0, 1], got {bad[0]}")
    cols = ["request_id", "kind", "round", "pos", "rank", "mass_above", "entropy_p"]
    cols += ["entropy_q", "passed_ratio", "accepted", "cause"]
    pos_lf = _lazy(runs.positions, "positions", cols)
    have = pos_lf.collect_schema().names()
    # run_id only separates blocks of several runs; with one run it is 10M dead strings.
    keep = ("run_id", "es", "rule") if len(runs.manifests) != 1 else ("es", "rule")
    extra = [c for c in keep if c in have]
    # Categorical strings: 10M short repeated strings cost far less memory and time.
    cat = [c for c in ("request_id", "run_id", "kind", "cause", "rule") if c in [*cols, *extra]]
    pos_lf = pos_lf.select(*cols, *extra).with_columns(pl.col(cat).cast(pl.Categorical))
    if "es" in extra and es_grid is not None:
        pos_lf = flatten_es(pos_lf, len(es_grid))
    # One chunk per column: a scan of many part files yields thousands of chunks, and
    # every later group_by / window pays for them.
    pos = pos_lf.collect().rechunk()
    rounds = _needed(runs.rounds, "rounds", _ROUND_COLS)
    requests = _needed(runs.requests, "requests", _REQUEST_COLS)

    # Runs collected without per-position logs (or still empty) get the request- and
    # round-level statistics only; missing ones are empty lists / nulls, never errors.
    has_pos, has_rounds = pos.height > 0, rounds.height > 0
    empty = pl.DataFrame(schema={"measure": pl.String})
    # Shares are clustered by request, or by item when items have several samples.
    pos, unit = with_position_unit(pos, requests) if has_pos else (pos, CLUSTER)
    anat = rejection_anatomy(pos, grid, TOPK, cluster=unit, alpha=alpha) if has_pos else empty
    nuc = anat.filter(pl.col("measure") == "nucleus")
    topk = anat.filter(pl.col("measure") == "topk")
    ent_out: dict[str, Any] = {}
    if has_pos:
        ent = entropy_gaps(pos, cluster=unit, alpha=alpha)
        for s in SUBSETS:
            d = {r["measure"]: r for r in ent.filter(pl.col("subset") == s).to_dicts()}
            ent_out[s] = {
                "entropy_p": d["entropy_p"]["mean"],
                "entropy_q": d["entropy_q"]["mean"],
                "gap": d["gap"]["mean"],
                "gap_ci_low": d["gap"]["ci_low"],
                "gap_ci_high": d["gap"]["ci_high"],
                "n_positions": d["gap"]["n_positions"],
            }
    acc_pos = acceptance_by_position(pos, cluster=unit, alpha=alpha) if has_pos else None
    s0: dict[str, Any] = {}
    if has_rounds:
        # One run's own cost table models its speed over target-only decoding.
        table = runs.manifests[0].cost_table if len(runs.manifests) == 1 else None
        s0 = speed(rounds, requests if requests.height else None, alpha=alpha,
                   cost_table=table).row(0, named=True)  # fmt: skip
    rules = sorted({m.rule for m in runs.manifests})
    out: dict[str, Any] = {
        "schema_version": AUDIT_SCHEMA_VERSION,
        "runs": [m.run_id for m in runs.manifests],
        "rules": rules,
        **_identity(runs.manifests),
        "reference": {
            "runs": [m.run_id for m in reference.manifests],
            "rule": _identity(reference.manifests)["rule"],
        }
        if reference is not None
        else None,
        "baseline_runs": [m.run_id for m in baseline.manifests] if baseline is not None else None,
        "alpha": alpha,
        "theta_grid": list(grid),
        # Runs read without checking their commit records and values (verify off).
        "verified": all(f is None or f.verified for f in (runs, reference, baseline)),
        "unverified_runs": sorted(
            {u for f in (runs, reference, baseline) if f is not None for u in f.unverified}
        ),
        "n_requests": int(requests.height),
        "n_positions": int(pos.height),
        "rejected_in_nucleus": _records(
            nuc, ["theta", "fraction", "ci_low", "ci_high", "n_rejected"]
        )
        if has_pos
        else [],
        "topk_share": _records(topk, ["k", "fraction", "ci_low", "ci_high"]) if has_pos else [],
        "entropy": ent_out,
        "tau_mean": s0.get("tau_mean"),
        "tau_ci": [s0.get("tau_ci_low"), s0.get("tau_ci_high")],
        "acceptance_rate": s0.get("alpha"),
        "acceptance_by_position": _records(acc_pos, ["pos", "accept_rate", "ci_low", "ci_high"])
        if acc_pos is not None
        else [],
        "k_mean": s0.get("k_mean"),
        "verify_share": s0.get("verify_share"),
        "draft_cost_ratio": s0.get("c"),  # measured (wall clock) draft/target step ratio
        "modelled_tau": s0.get("modelled_tau"),
        "modelled_speedup": s0.get("modelled_speedup"),
        # Why the cost tables that price these numbers may be wrong (empty: none flagged).
        "cost_warnings": cost_warnings_of(
            m for f in (runs, reference, baseline) if f is not None for m in f.manifests
        ),
        "passes_per_token": s0.get("passes_per_token"),
        "tokens_per_s": s0.get("tokens_per_s"),
    }
    # The first-order NSD sweep replays a ratio-test run's own rejections (THEORY §3).
    sweep = bool(rules) and all(r in RULES and RULES[r].ratio_test for r in rules)
    if has_pos and (sweep or (not rules and "rule" not in extra)):
        cf = counterfactual_nsd(pos, grid, es_grid=es_grid)
        out["counterfactual_nsd_first_order"] = _records(cf, cf.columns)
    ref_req = hd = None
    if reference is not None:
        ref_req = _needed(reference.requests, "reference", _REQUEST_COLS)
        hd = hash_divergence(requests, ref_req, by=[], alpha=alpha)
        out["hash_divergence"] = json_safe(hd.row(0, named=True))
    run_theta = nsd_theta(runs.manifests)
    if has_pos and es_grid is not None and "_es0" in pos.columns and run_theta is not None:
        try:
            j = es_index(run_theta, es_grid)
        except ValueError:
            j = None
        if j is not None:
            dev = deviation_accounting(pos, j, divergence=hd)
            out["deviation"] = {"theta": run_theta, **json_safe(dev.row(0, named=True))}
            dbp = deviation_by_position(pos, j, cluster=unit, alpha=alpha)
            out["deviation"]["by_position"] = _records(dbp, dbp.columns)
    if ref_req is not None:
        by = ["task"] if "task" in requests.columns and "task" in ref_req.columns else []
        if requests["score"].is_not_null().any() and ref_req["score"].is_not_null().any():
            acc = accuracy_delta(
                requests, ref_req, ni_margin=ni_margin, by=by, alpha=alpha, correction=correction
            )
            pooled = accuracy_delta(requests, ref_req, ni_margin=ni_margin, by=[], alpha=alpha)
            p0 = pooled.row(0, named=True)
            out["accuracy_delta"] = json_safe(
                {
                    "delta": p0["delta"],
                    "ci_low": p0["ci_low"],
                    "ci_high": p0["ci_high"],
                    "ni_low": p0["ni_low"],
                    "p_mcnemar": p0["p_mcnemar"],
                    "p_noninferiority": p0["p_noninf"],
                    "noninferior": p0["noninferior"],
                    "ni_margin": ni_margin,
                    "n_items": p0["n_items"],
                    "per_task": _records(acc, acc.columns),
                }
            )
        sp = _modelled(requests, runs, ref_req, reference, alpha=alpha, same_kind=True)
        out["speedup_vs_reference"] = json_safe(sp)
        wall = paired_speedup(requests, ref_req, by=[], alpha=alpha).row(0, named=True)
        out["wall_speedup_vs_reference"] = json_safe(wall)
    if baseline is not None:
        base_req = _needed(baseline.requests, "baseline", _REQUEST_COLS)
        # Target-only steps and speculative rounds cost differently: a cost table is needed.
        sp = _modelled(requests, runs, base_req, baseline, alpha=alpha, same_kind=False)
        out["speedup_vs_baseline"] = json_safe(sp)
        wall = paired_speedup(requests, base_req, by=[], alpha=alpha).row(0, named=True)
        out["wall_speedup_vs_baseline"] = json_safe(wall)
    return json_safe(out)


def summary_json(summary: Mapping[str, Any]) -> str:
    """The summary as indented JSON (NaN-free: non-finite numbers are null)."""
    return json.dumps(json_safe(dict(summary)), indent=2, sort_keys=False)
