"""The verdict per relaxed rule and ``summary.json``, the record a task is signed off on.

``summary.json`` (schema :data:`SUMMARY_SCHEMA_VERSION`, documented in ``docs/REPORTS.md``)
holds the verdict per relaxed rule family and the numbers behind it; the batch runner
writes it and the ``signoff`` notebook renders the same dict (:func:`task_summary`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit._compat import renamed_kwargs
from relaxspec_audit.report.audits import audit_table
from relaxspec_audit.report.format import _now
from relaxspec_audit.report.jsonio import _jsonable
from relaxspec_audit.report.runs import manifest_facts

#: Name and version of the ``summary.json`` schema; bump the version on any rename,
#: retype or removal of a field (adding fields is fine). See docs/REPORTS.md.
SUMMARY_SCHEMA = "relaxspec_audit.summary"
SUMMARY_SCHEMA_VERSION = 2


@renamed_kwargs(margin="ni_margin")
def recommend(
    runs_dir: str | Path,
    task: str,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    discovery: str = "discovery",
    confirmation: str = "confirmation",
    min_items: int = 30,
    table: Any = None,
) -> list[dict[str, Any]]:
    """Choose a setting per relaxed rule on ``discovery``, judge it on ``confirmation``.

    The choice and the verdict are ``select.recommend``'s (THEORY §3 "Choosing θ or a
    budget": the fastest setting non-inferior at ``ni_margin`` on discovery, re-tested on
    the disjoint confirmation split, ``PASS`` / ``FAIL`` / ``INCONCLUSIVE``, never
    ``PASS`` on fewer items than the power calculation asks for). This function gathers
    each relaxed rule's runs and its paired reference runs, and attaches the audit rows
    of the chosen setting (divergence, τ, the coupling bound, speed-up over target-only
    decoding) so that a report can show them beside the verdict. A task without a
    scorer has no accuracy to test: its verdict is ``INCONCLUSIVE`` and its rows still
    show divergence and speed.

    Args:
        runs_dir: folder of run folders.
        task: task name.
        ni_margin: non-inferiority margin δ (score units).
        alpha: 1 − confidence level and test level.
        discovery: split the setting is chosen on.
        confirmation: split the choice is judged on.
        min_items: never certify on fewer confirmation items than this.
        table: a precomputed :func:`audit_table` of both splits (else computed).

    Returns:
        One dict per relaxed rule: ``rule, reference, knob, verdict`` (``PASS`` |
        ``FAIL`` | ``INCONCLUSIVE``), ``chosen`` (the setting's parameters or None),
        ``setting`` (its label), ``shown_setting`` (the setting whose rows are shown: the
        chosen one, else the fastest on discovery), ``discovery`` / ``confirmation``
        (its audit rows), ``frontier`` (discovery audit rows), ``reasons``, ``caveats``,
        ``n_required`` and ``select`` (``Verdict.to_dict()``: the numbers behind it).
    """
    import polars as pl

    from relaxspec_audit import select as select_mod
    from relaxspec_audit.collect import logs

    if table is None:
        table = audit_table(runs_dir, task, ni_margin=ni_margin, alpha=alpha)
    out = []
    relaxed = table.filter(~pl.col("is_reference"))
    for rule in relaxed["rule"].unique(maintain_order=True).to_list():
        fam = relaxed.filter(pl.col("rule") == rule)
        knob = fam["knob"][0]
        cols = list(select_mod.setting_params(rule))
        rel_dirs = fam["run_dir"].to_list()
        ref_dirs = sorted({d for d in fam["reference_dir"].to_list() if d is not None})
        caveats: list[str] = []
        verdict = None
        scored = fam["accuracy_delta"].is_not_null().any()
        if not ref_dirs:
            reasons = [f"no paired {fam['reference'][0]} run to judge {rule} against"]
        elif not scored:
            reasons = ["the task has no scorer: accuracy cannot be tested"]
            caveats.append("fidelity is shown by output divergence only")
        else:
            settings = select_mod.settings_frame([logs.read_manifest(d) for d in rel_dirs])
            requests = logs.scan(rel_dirs, "requests").collect().join(settings, on="run")
            reference = logs.scan(ref_dirs, "requests").collect()
            try:
                verdict = select_mod.recommend(
                    requests, reference, cols, ni_margin=ni_margin, alpha=alpha,
                    min_items=min_items, discovery=discovery, confirmation=confirmation,
                )  # fmt: skip
                reasons = list(verdict.reasons)
            except ValueError as exc:
                reasons = [f"no verdict: {exc}"]
        chosen = verdict.setting if verdict is not None else None
        rows = {split: _setting_row(fam, split, chosen) for split in (discovery, confirmation)}
        shown = (rows[discovery] or {}).get("setting")
        if chosen is None:
            # Nothing chosen: show the fastest setting's numbers, labelled as not chosen.
            label = fastest_setting(fam.filter(pl.col("split") == discovery))
            if label is not None:
                rows = {
                    split: _public(_first(fam.filter((pl.col("split") == split)
                                                     & (pl.col("setting") == label))))
                    for split in (discovery, confirmation)
                }  # fmt: skip
                shown = label
        for split, row in rows.items():
            if row is not None and row.get("bound") is not None:
                if (row.get("identical_ci_high") or 0.0) < row["bound"]:
                    caveats.append(
                        f"{split}: measured identical-output rate is below the (1 − ε)^T bound"
                    )
        disc = fam.filter(pl.col("split") == discovery).sort("value")
        status = verdict.status if verdict is not None else "INCONCLUSIVE"
        out.append(
            _jsonable(
                {
                    "rule": rule,
                    "reference": fam["reference"][0],
                    "knob": knob,
                    "verdict": status,
                    "chosen": chosen,
                    "setting": shown if chosen else None,
                    "shown_setting": shown,
                    "discovery": rows[discovery],
                    "confirmation": rows[confirmation],
                    "frontier": [_public(r) for r in disc.iter_rows(named=True)],
                    "reasons": reasons,
                    "caveats": caveats,
                    "n_required": verdict.n_required if verdict is not None else None,
                    "select": verdict.to_dict() if verdict is not None else None,
                }
            )
        )
    return out


def fastest_setting(rows: Any) -> str | None:
    """Label of the fastest setting among audit rows, as ``select._fastest`` ranks them.

    By τ (a function of the logs); ties go to the larger accuracy delta, the smaller ε,
    then the smaller setting value. Never by wall clock: equal logs show the same setting.
    """
    if not rows.height:
        return None
    ranked = rows.sort(
        ["tau", "accuracy_delta", "eps_mean", "value", "setting"],
        descending=[True, True, False, False, False],
        nulls_last=True,
    )
    return ranked["setting"][0]


def _first(frame: Any) -> dict[str, Any] | None:
    return frame.row(0, named=True) if frame.height else None


def _setting_row(fam: Any, split: str, setting: Mapping[str, Any] | None) -> dict | None:
    """The audit row of ``setting`` (select's parameter dict) on ``split``."""
    if not setting:
        return None
    for row in fam.filter(fam["split"] == split).iter_rows(named=True):
        params = json.loads(row["params"])
        if all(params.get(k) == v for k, v in setting.items()):
            return _public(row)
    return None


def _public(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An audit row without local paths (summary.json must not depend on the machine)."""
    if row is None:
        return None
    return {k: v for k, v in row.items() if k not in ("run_dir", "reference_dir")}


@renamed_kwargs(margin="ni_margin")
def task_summary(
    runs_dir: str | Path,
    task: str,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    batch: str | None = None,
    run_dirs: Sequence[str | Path] | None = None,
    errors: Sequence[str] = (),
    notebooks: Sequence[Mapping[str, Any]] = (),
    parameters: Mapping[str, Any] | None = None,
    table: Any = None,
) -> dict[str, Any]:
    """The ``summary.json`` of one task (schema in docs/REPORTS.md).

    Args:
        runs_dir: folder of run folders.
        task: task name (or JSONL path).
        ni_margin: non-inferiority margin δ (score units).
        alpha: 1 − confidence level.
        batch: batch name (None outside a batch).
        run_dirs: the runs the batch collected for this task (recorded, not required).
        errors: collection errors to record; any error makes ``status`` ``failed``.
        notebooks: ``{name, ok, html, error}`` per rendered notebook.
        parameters: notebook parameters of the task (``ni_margin`` and ``alpha`` are read
            from here when given; the old key ``margin`` is read with a ``FutureWarning``).
        table: a precomputed :func:`audit_table` of both splits (else computed).

    Returns:
        A JSON-ready dict; statistics that fail are recorded in ``errors``.
    """
    from relaxspec_audit import __version__
    from relaxspec_audit.collect.config import task_slug

    parameters = dict(parameters or {})
    if "margin" in parameters:  # the old name of ni_margin (a batch config maps it)
        if "ni_margin" in parameters:
            raise TypeError("parameters: give ni_margin only (margin is its old name)")
        warnings.warn(
            "parameters: 'margin' is deprecated, use 'ni_margin' (the non-inferiority margin δ; "
            "`margin` is a verification rule)",
            FutureWarning,
            stacklevel=3,  # the caller, past renamed_kwargs
        )
        parameters["ni_margin"] = parameters.pop("margin")
    ni_margin = float(parameters.get("ni_margin", ni_margin))
    alpha = float(parameters.get("alpha", alpha))
    errors = list(errors)
    families: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    try:
        families = recommend(runs_dir, task, ni_margin=ni_margin, alpha=alpha, table=table)
        facts = manifest_facts(runs_dir, task)
    except Exception as exc:  # the summary must still be written, saying what failed
        errors.append(f"summary: {type(exc).__name__}: {exc}")
    summary = {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "batch": batch,
        "task": task,
        "task_slug": task_slug(task),
        "generated_at": _now(),
        "package_version": __version__,
        "status": "ok",
        "ni_margin": ni_margin,
        "alpha": alpha,
        "families": families,
        "manifest": facts,
        "n_runs": facts.get("n_runs"),
        "notebooks": [],
        "errors": [],
    }
    return finish_summary(
        summary,
        batch=batch,
        errors=errors,
        notebooks=notebooks,
        n_runs=len(run_dirs) if run_dirs is not None else None,
    )


def finish_summary(
    summary: Mapping[str, Any],
    *,
    batch: str | None = None,
    errors: Sequence[str] = (),
    notebooks: Sequence[Mapping[str, Any]] = (),
    n_runs: int | None = None,
) -> dict[str, Any]:
    """Add the batch's facts to a :func:`task_summary` dict and set its ``status``.

    ``status`` is ``failed`` when the summary or the batch recorded an error or any
    notebook failed, else ``ok``.
    """
    out = {k: v for k, v in summary.items() if k != "python"}
    out["batch"] = batch if batch is not None else out.get("batch")
    out["errors"] = [*out.get("errors", []), *errors]
    out["notebooks"] = [*out.get("notebooks", []), *notebooks]
    if n_runs is not None:
        out["n_runs"] = n_runs
    failed = [nb for nb in out["notebooks"] if not nb.get("ok")]
    out["status"] = "failed" if out["errors"] or failed else "ok"
    return _jsonable(out)
