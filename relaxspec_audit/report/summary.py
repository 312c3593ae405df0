"""The verdict per relaxed rule and ``summary.json``, the record a task is signed off on.

``summary.json`` (schema :data:`SUMMARY_SCHEMA_VERSION`, documented in ``docs/REPORTS.md``)
holds the verdict per relaxed rule family and the numbers behind it; the batch runner
writes it and the ``signoff`` notebook renders the same dict (:func:`task_summary`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit.report.anatomy import RATIO_TEST_RULE, anatomy_block
from relaxspec_audit.report.audits import audit_table
from relaxspec_audit.report.coupling import coupling_facts
from relaxspec_audit.report.format import _now
from relaxspec_audit.report.jsonio import _jsonable
from relaxspec_audit.report.noise import attribution_facts, floor_facts, loglik_facts
from relaxspec_audit.report.runs import manifest_facts, runs_table, split_note
from relaxspec_audit.report.speed import speed_facts

#: Name and version of the ``summary.json`` schema; bump the version on any rename,
#: retype or removal of a field (adding fields is fine). See docs/REPORTS.md.
SUMMARY_SCHEMA = "relaxspec_audit.summary"
#: 3: verdict ``NO-GAIN``; the rows' speed-ups are modelled (wall clock in ``wall_*``);
#: per family ``speed``, ``noise_floor``, ``attribution``, ``loglik``, ``coupling``.
#: The top-level ``rejection_anatomy`` was added within 3 (an added key: compatible).
SUMMARY_SCHEMA_VERSION = 3


def recommend(
    runs_dir: str | Path,
    task: str,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    discovery: str = "discovery",
    confirmation: str = "confirmation",
    min_items: int = 30,
    min_gain: float = 1.0,
    table: Any = None,
    timings: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Choose a setting per relaxed rule on ``discovery``, judge it on ``confirmation``.

    The choice and the verdict are ``select.recommend``'s (THEORY §3 "Choosing θ or a
    budget": the fastest setting non-inferior at ``ni_margin`` on discovery, re-tested on
    the disjoint confirmation split, ``PASS`` / ``NO-GAIN`` / ``FAIL`` / ``INCONCLUSIVE``,
    never ``PASS`` on fewer items than the power calculation asks for nor without a
    modelled speed-up above ``min_gain``). This function gathers
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
        min_gain: PASS needs the modelled speed-up's lower bound above this.
        table: a precomputed :func:`audit_table` of both splits (else computed).
        timings: paired timing-pass results keyed by ``(rule, setting label)``
            (``{"speedup", "ci_low", "ci_high", "label"}``), shown as the wall clock.

    Returns:
        One dict per relaxed rule: ``rule, reference, knob, verdict`` (``PASS`` |
        ``NO-GAIN`` | ``FAIL`` | ``INCONCLUSIVE``), ``chosen`` (the setting's parameters or None),
        ``setting`` (its label), ``shown_setting`` (the setting whose rows are shown: the
        chosen one, else the fastest on discovery), ``discovery`` / ``confirmation``
        (its audit rows), ``frontier`` (discovery audit rows), ``speed``
        (:func:`~relaxspec_audit.report.speed.speed_facts`), ``reasons``, ``caveats``,
        ``n_required`` and ``select`` (``Verdict.to_dict()``: the numbers behind it).
    """
    import polars as pl

    from relaxspec_audit.audit import select as select_mod
    from relaxspec_audit.collect import logs

    if table is None:
        table = audit_table(runs_dir, task, ni_margin=ni_margin, alpha=alpha)
    runs = runs_table(runs_dir, task)
    no_split = split_note(runs_dir, task, (discovery, confirmation))
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
        elif no_split:
            reasons = [no_split]
        elif not scored:
            reasons = ["the task has no scorer: accuracy cannot be tested"]
            caveats.append("fidelity is shown by output divergence only")
        else:
            settings = select_mod.settings_frame([logs.read_manifest(d) for d in rel_dirs])
            requests = logs.scan(rel_dirs, "requests").collect().join(settings, on="run")
            # The reference's own cost of a pass: the modelled speed-up compares the two.
            ref_costs = select_mod.settings_frame([logs.read_manifest(d) for d in ref_dirs])
            costs = ref_costs.select("run", select_mod.PASS_COST, select_mod.COST_TABLE)
            reference = logs.scan(ref_dirs, "requests").collect().join(costs, on="run", how="left")
            try:
                verdict = select_mod.recommend(
                    requests, reference, cols, ni_margin=ni_margin, alpha=alpha,
                    min_items=min_items, min_gain=min_gain, discovery=discovery,
                    confirmation=confirmation,
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
        # Speed facts of the shown setting: confirmation when it has them, else discovery.
        split_shown = confirmation if rows[confirmation] else discovery
        ref_row = _first(
            table.filter(pl.col("is_reference") & (pl.col("rule") == fam["reference"][0])
                         & (pl.col("split") == split_shown))
        )  # fmt: skip
        if timings is not None:
            timing = timings.get((rule, shown))
        else:
            timing = _stored_timing(runs_dir, fam, table, discovery, shown, alpha)
        speed = speed_facts(rows[split_shown], ref_row, timing)
        speed["split"] = split_shown
        disc_row = _first(fam.filter((pl.col("split") == discovery) & (pl.col("setting") == shown)))
        coupling = _guarded(coupling_facts, runs_dir, disc_row, ni_margin=ni_margin, alpha=alpha)
        # Fidelity evidence on the split the numbers are shown for.
        shown_row = _first(fam.filter((pl.col("split") == split_shown)
                                      & (pl.col("setting") == shown)))  # fmt: skip
        floor = attribution = loglik = None
        if shown_row is not None and shown_row.get("reference_dir"):
            rel_dir, ref_dir = shown_row["run_dir"], shown_row["reference_dir"]
            floor = _guarded(floor_facts, runs_dir, shown_row, runs, alpha=alpha)
            attribution = _guarded(attribution_facts, rel_dir, ref_dir, rule, alpha=alpha)
            loglik = _guarded(loglik_facts, rel_dir, ref_dir, alpha=alpha)
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
                    "speed": speed,
                    "noise_floor": floor,
                    "attribution": attribution,
                    "loglik": loglik,
                    "coupling": coupling,
                    "reasons": reasons,
                    "caveats": caveats,
                    "n_required": verdict.n_required if verdict is not None else None,
                    "select": verdict.to_dict() if verdict is not None else None,
                }
            )
        )
    return out


def fastest_setting(rows: Any) -> str | None:
    """Label of the fastest setting among audit rows: ``select._fastest``'s ranking.

    By the modelled speed-up over the reference, then τ (both functions of the logs); ties
    go to the larger accuracy delta, the smaller ε, then the smaller setting value. Never
    by wall clock: equal logs show the same setting.
    """
    from relaxspec_audit.audit.select import _fastest

    if not rows.height:
        return None
    names = {"speedup_vs_reference": "speedup", "accuracy_delta": "delta", "eps_mean": "eps"}
    frame = rows.rename({k: v for k, v in names.items() if k in rows.columns})
    return _fastest(frame, ["value", "setting"])["setting"]


def _guarded(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """An evidence block beside the verdict; its failure is recorded, never fatal.

    The verdict stands on the accuracy test and the modelled speed-up; the noise floor,
    attribution and coupling blocks explain it, so a defect in one of them shows as that
    block's ``error`` instead of losing the sign-off.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "sentence": None}


def _run_id(run_dir: str | None) -> str | None:
    """The run id of a run folder (``…/run=<id>``)."""
    name = Path(run_dir).name if run_dir else ""
    return name.split("=", 1)[1] if name.startswith("run=") else None


def _stored_timing(
    runs_dir: str | Path, fam: Any, table: Any, split: str, setting: str | None, alpha: float
) -> dict[str, Any] | None:
    """The paired timing pass of ``setting`` on ``split`` against its reference, if stored."""
    import polars as pl

    from relaxspec_audit.report.speed import timing_for

    row = _first(fam.filter((pl.col("split") == split) & (pl.col("setting") == setting)))
    if row is None or row.get("reference_dir") is None:
        return None
    ref, cand = _run_id(row["reference_dir"]), _run_id(row["run_dir"])
    if ref is None or cand is None:
        return None
    timing = timing_for(runs_dir, ref, cand, alpha=alpha)
    if timing is not None:  # the modelled numbers beside it may be another split's
        timing["label"] += f" (the {split} runs)"
    return timing


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


def task_summary(
    runs_dir: str | Path,
    task: str,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    min_gain: float = 1.0,
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
        min_gain: the minimum modelled speed-up over the reference that PASS needs (read
            from ``parameters`` when given there).
        batch: batch name (None outside a batch).
        run_dirs: the runs the batch collected for this task (recorded, not required).
        errors: collection errors to record; any error makes ``status`` ``failed``.
        notebooks: ``{name, ok, html, error}`` per rendered notebook.
        parameters: notebook parameters of the task (``ni_margin`` and ``alpha`` are read
            from here when given).
        table: a precomputed :func:`audit_table` of both splits (else computed).

    Returns:
        A JSON-ready dict; statistics that fail are recorded in ``errors``. Its
        ``rejection_anatomy`` is :func:`~relaxspec_audit.report.anatomy.anatomy_block`
        (where the ``exact`` runs' rejected drafts lie, THEORY §3); a failure there shows
        as that block's ``error``, like the evidence blocks of a family.
    """
    from relaxspec_audit import __version__
    from relaxspec_audit.collect.config import task_slug

    parameters = dict(parameters or {})
    ni_margin = float(parameters.get("ni_margin", ni_margin))
    alpha = float(parameters.get("alpha", alpha))
    min_gain = float(parameters.get("min_gain", min_gain))
    errors = list(errors)
    families: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    try:
        families = recommend(
            runs_dir, task, ni_margin=ni_margin, alpha=alpha, min_gain=min_gain, table=table
        )
        facts = manifest_facts(runs_dir, task)
    except Exception as exc:  # the summary must still be written, saying what failed
        errors.append(f"summary: {type(exc).__name__}: {exc}")
    try:
        anatomy = anatomy_block(runs_dir, task, alpha=alpha)
    except Exception as exc:  # evidence beside the verdicts: its failure shows in the block
        error = f"{type(exc).__name__}: {exc}"
        anatomy = {"rule": RATIO_TEST_RULE, "alpha": alpha, "runs": [],
                   "note": f"not computed: {error}", "error": error}  # fmt: skip
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
        "min_gain": min_gain,
        "families": families,
        "rejection_anatomy": anatomy,
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
