"""The audit table: every run of a task against its paired reference, one row each.

The rows are :func:`~relaxspec_audit.audit.summary.audit_summary` flattened (speed-up,
accuracy delta with its non-inferiority test, hash divergence, the (1 − ε)^T coupling
bound of THEORY §2.3): the data of the frontier, of the verdict's evidence and of the
report's figures. A row of the frame is a :class:`~relaxspec_audit.audit.results.SettingRow`
once its local paths are dropped (:func:`setting_row`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.audit.records import SettingRow
from relaxspec_audit.audit.runs import TaskRuns, is_lossless
from relaxspec_audit.verify import registry
from relaxspec_audit.verify.registry import TARGET_ONLY

_SCHEMA = {
    "rule": pl.String, "reference": pl.String, "knob": pl.String, "value": pl.Float64,
    "setting": pl.String, "split": pl.String, "is_reference": pl.Boolean,
    "n_requests": pl.Int64, "tau": pl.Float64, "tau_reference": pl.Float64,
    "speedup_vs_reference": pl.Float64, "speedup_ci_low": pl.Float64,
    "speedup_ci_high": pl.Float64, "speed_basis": pl.String, "speed_note": pl.String,
    "wall_speedup_vs_reference": pl.Float64, "wall_ci_low": pl.Float64,
    "wall_ci_high": pl.Float64, "speedup_vs_baseline": pl.Float64,
    "baseline_ci_low": pl.Float64, "baseline_ci_high": pl.Float64,
    "wall_speedup_vs_baseline": pl.Float64,
    "accuracy_delta": pl.Float64, "delta_ci_low": pl.Float64, "delta_ci_high": pl.Float64,
    "delta_ni_low": pl.Float64, "p_noninferiority": pl.Float64, "noninferior": pl.Boolean,
    "score": pl.Float64,
    "divergence": pl.Float64, "divergence_ci_low": pl.Float64,
    "divergence_ci_high": pl.Float64, "first_pos_median": pl.Float64,
    "eps_mean": pl.Float64, "bound": pl.Float64, "identical_rate": pl.Float64,
    "identical_ci_low": pl.Float64, "identical_ci_high": pl.Float64,
    "params": pl.String, "run_dir": pl.String, "reference_dir": pl.String,
}  # fmt: skip
#: Columns of an audit-table row that are local paths: never in a summary.
LOCAL = ("run_dir", "reference_dir")


def audit_table(
    runs: TaskRuns | str | Path,
    task: str | None = None,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    split: str | None = None,
) -> pl.DataFrame:
    """Every relaxed run of a task audited against its reference: the frontier's data.

    One ``audit_summary`` per relaxed run (with its paired reference and the target-only
    baseline when present), flattened to one row; plus one row per reference run itself
    (``setting`` = the reference rule, delta 0) so the frontier shows it.

    Args:
        runs: the task's runs (:class:`TaskRuns`), or a runs folder with ``task``.
        task: the task, when ``runs`` is a folder.
        ni_margin: non-inferiority margin δ on the score scale.
        alpha: 1 − confidence level.
        split: only this split (None: every split).

    Returns:
        One row per (rule, setting, split): the fields of
        :class:`~relaxspec_audit.audit.results.SettingRow` plus ``run_dir`` and
        ``reference_dir``. Speed-ups are modelled (pass counts × the cost table); the
        ``wall_*`` columns are the collection's wall clock (load-dependent, for reference
        only); ``delta_ni_low`` is the one-sided 1 − α bound the non-inferiority test
        inverts.
    """
    from relaxspec_audit.audit.summary import audit_summary

    if not isinstance(runs, TaskRuns):
        runs = TaskRuns.load(runs, task)
    table = runs.table if split is None else runs.table.filter(pl.col("split") == split)
    rows = []
    ref_cache: dict[str, dict[str, Any]] = {}
    for row in table.iter_rows(named=True):
        rule = row["rule"]
        if rule == TARGET_ONLY:
            continue
        is_ref = is_lossless(rule)
        ref_rule, ref_dir = runs.reference_of(row)
        base_dir = runs.baseline_of(row)
        summary = audit_summary(
            [row["run_dir"]], reference=[ref_dir] if ref_dir else None,
            baseline=[base_dir] if base_dir else None, ni_margin=ni_margin, alpha=alpha,
        )  # fmt: skip
        acc = summary.get("accuracy_delta") or {}
        hd = summary.get("hash_divergence") or {}
        sp = summary.get("speedup_vs_reference") or {}  # modelled: pass counts × cost table
        wall = summary.get("wall_speedup_vs_reference") or {}
        base = summary.get("speedup_vs_baseline") or {}
        # The (1 − ε)^T coupling bound is NSD's (THEORY §2.3): E_S is its deviation per step.
        spec = registry.RULES.get(rule)
        nsd = spec is not None and registry.NSD_DEVIATION in spec.measures
        dev = (summary.get("deviation") or {}) if nsd else {}
        ref_summary = None
        if ref_dir is not None:
            if ref_dir not in ref_cache:
                ref_cache[ref_dir] = audit_summary([ref_dir], ni_margin=ni_margin, alpha=alpha)
            ref_summary = ref_cache[ref_dir]
        score = _mean_score(row["run_dir"])
        rows.append(
            {
                "rule": rule,
                "reference": ref_rule,
                "knob": row["knob"],
                "value": row["value"],
                "setting": row["setting"],
                "split": row["split"],
                "is_reference": is_ref,
                "n_requests": summary.get("n_requests"),
                "tau": summary.get("tau_mean"),
                "tau_reference": (ref_summary or summary).get("tau_mean"),
                "speedup_vs_reference": 1.0 if is_ref else sp.get("speedup"),
                "speedup_ci_low": 1.0 if is_ref else sp.get("ci_low"),
                "speedup_ci_high": 1.0 if is_ref else sp.get("ci_high"),
                "speed_basis": None if is_ref else sp.get("basis"),
                "speed_note": None if is_ref else sp.get("note"),
                "wall_speedup_vs_reference": 1.0 if is_ref else wall.get("speedup"),
                "wall_ci_low": 1.0 if is_ref else wall.get("ci_low"),
                "wall_ci_high": 1.0 if is_ref else wall.get("ci_high"),
                "speedup_vs_baseline": base.get("speedup"),
                "baseline_ci_low": base.get("ci_low"),
                "baseline_ci_high": base.get("ci_high"),
                "wall_speedup_vs_baseline": (summary.get("wall_speedup_vs_baseline") or {}).get(
                    "speedup"
                ),
                "accuracy_delta": 0.0 if is_ref and score is not None else acc.get("delta"),
                "delta_ci_low": acc.get("ci_low"),
                "delta_ci_high": acc.get("ci_high"),
                "delta_ni_low": acc.get("ni_low"),
                "p_noninferiority": acc.get("p_noninferiority"),
                "noninferior": acc.get("noninferior"),
                "score": score,
                "divergence": 0.0 if is_ref else hd.get("rate"),
                "divergence_ci_low": hd.get("ci_low"),
                "divergence_ci_high": hd.get("ci_high"),
                "first_pos_median": hd.get("first_pos_median"),
                "eps_mean": dev.get("eps_mean"),
                "bound": dev.get("bound_product"),
                "identical_rate": dev.get("identical_rate"),
                "identical_ci_low": dev.get("ci_low"),
                "identical_ci_high": dev.get("ci_high"),
                "params": row["params"],
                "run_dir": row["run_dir"],
                "reference_dir": ref_dir,
            }
        )
    return pl.DataFrame(rows, schema=_SCHEMA).sort(
        ["reference", "is_reference", "rule", "value", "split"],
        descending=[False, True, False, False, False], nulls_last=True,
    )  # fmt: skip


def setting_row(row: Mapping[str, Any] | None) -> SettingRow | None:
    """An audit-table row as a typed record, without its local paths."""
    if row is None:
        return None
    return SettingRow(**{k: v for k, v in row.items() if k not in LOCAL})


def _mean_score(run_dir: str) -> float | None:
    from relaxspec_audit.collect import logs

    req = logs.scan([run_dir], "requests").select(pl.col("score").mean()).collect()
    value = req["score"][0]
    return float(value) if value is not None else None


def first_divergences(runs: TaskRuns, *, split: str | None = None) -> pl.DataFrame:
    """``first_divergence`` of every relaxed run against its reference, labelled.

    Returns:
        Columns of :func:`~relaxspec_audit.audit.fidelity.first_divergence` plus ``rule``,
        ``setting``, ``split``.
    """
    from relaxspec_audit.audit.fidelity import first_divergence
    from relaxspec_audit.collect import logs

    table = runs.table if split is None else runs.table.filter(pl.col("split") == split)
    frames = []
    for row in table.iter_rows(named=True):
        if is_lossless(row["rule"]):
            continue
        _, ref = runs.reference_of(row)
        if ref is None:
            continue
        fd = first_divergence(
            logs.scan([row["run_dir"]], "requests"), logs.scan([ref], "requests"), by=[]
        )
        frames.append(
            fd.with_columns(
                pl.lit(row["rule"]).alias("rule"),
                pl.lit(row["setting"]).alias("setting"),
                pl.lit(row["split"]).alias("split"),
            )
        )
    if not frames:
        return pl.DataFrame(
            schema={
                "item_id": pl.String,
                "sample": pl.Int64,
                "diverged": pl.Boolean,
                "first_pos": pl.Int64,
                "n_tokens": pl.Int64,
                "rule": pl.String,
                "setting": pl.String,
                "split": pl.String,
            }
        )
    return pl.concat(frames, how="diagonal_relaxed")
