"""The sign-off: a verdict per relaxed rule family and the task audit around them.

This is where a task's verdicts are decided. For each relaxed rule of a task,
:func:`family_verdicts` gathers its runs and its paired reference runs, lets
:func:`~relaxspec_audit.audit.select.recommend` choose a setting on ``discovery`` and
judge it on ``confirmation`` (THEORY §3 "Choosing θ or a budget"), and attaches the
evidence a reviewer reads beside the verdict: the audit rows of the shown setting, its
speed (modelled, the wall clock labelled), the noise floor, where outputs first changed
and why, the likelihood delta and what coupling bought. :func:`audit_task` wraps them with
the task's rejection anatomy and how the runs were made into a
:class:`~relaxspec_audit.audit.results.TaskAudit`, whose JSON is ``summary.json``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.audit import evidence
from relaxspec_audit.audit.records import Verdict
from relaxspec_audit.audit.results import AnatomyBlock, FamilyVerdict, NotebookEntry, TaskAudit
from relaxspec_audit.audit.runs import TaskRuns
from relaxspec_audit.audit.speed_facts import speed_facts, timing_for
from relaxspec_audit.audit.table import audit_table, setting_row
from relaxspec_audit.collect.config import task_slug


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _first(frame: pl.DataFrame) -> dict[str, Any] | None:
    return frame.row(0, named=True) if frame.height else None


def _pt(value: float | None, *, sign: bool = True) -> str:
    return "n/a" if value is None else f"{100 * value:{'+' if sign else ''}.1f} pt"


def headline(verdict: Verdict | None, reasons: Sequence[str]) -> str:
    """The verdict's deciding reason as one short sentence (≤ 140 characters) for an index.

    Written from the verdict's numbers, never cut out of its reasons; without a verdict
    (no reference, no split, no scorer) the one reason given, capitalised.
    """
    if verdict is None:
        text = reasons[-1] if reasons else "no verdict"
        out = text[:1].upper() + text[1:]
        out = out if len(out) <= 139 else out[:138].rsplit(" ", 1)[0] + "…"
        return out if out.endswith(("…", ".")) else out + "."
    nums, status = verdict.numbers, verdict.status
    delta = _pt(nums.ni_margin, sign=False)
    conf = nums.confirmation
    if status in ("PASS", "NO-GAIN") and conf is not None:
        lo = conf.speedup_ci_low
        if status == "PASS":
            return (
                f"Non-inferior at δ = {delta} on confirmation ({conf.n_items} items), "
                f"{conf.speedup:.2f}× the reference (modelled, lower bound {lo:.2f})."
            )
        shown = "n/a" if lo is None else f"{lo:.2f}"
        return (f"Non-inferior at δ = {delta} on confirmation, but the modelled speed-up's "
                f"lower bound {shown} does not clear {nums.min_gain:g}×.")  # fmt: skip
    if status == "FAIL":
        if conf is None:
            return f"No setting is non-inferior at δ = {delta} on discovery."
        shown = (
            "Shown inferior" if (conf.ci_high or 0) < -nums.ni_margin else "Not shown non-inferior"
        )
        return (
            f"{shown} at δ = {delta} on confirmation (Δ {_pt(conf.delta)}, {conf.n_items} items)."
        )
    n = verdict.n_required
    if conf is not None:
        return f"Confirmation has {conf.n_items} items; about {n} per split are needed."
    if verdict.setting is not None:
        return "The chosen setting has no confirmation requests."
    return f"No setting shown non-inferior at δ = {delta} on discovery; about {n} items needed."


def fastest_setting(rows: pl.DataFrame) -> str | None:
    """Label of the fastest setting among audit rows: ``select._fastest``'s ranking.

    By the modelled speed-up over the reference, then τ (both functions of the logs); ties
    go to the larger accuracy delta, the smaller ε, then the smaller setting value. Never by
    wall clock: equal logs show the same setting.
    """
    from relaxspec_audit.audit.select import _fastest

    if not rows.height:
        return None
    names = {"speedup_vs_reference": "speedup", "accuracy_delta": "delta", "eps_mean": "eps"}
    frame = rows.rename({k: v for k, v in names.items() if k in rows.columns})
    return _fastest(frame, ["value", "setting"])["setting"]


def _setting_row(fam: pl.DataFrame, split: str, setting: Mapping[str, Any] | None) -> Any:
    """The audit row of ``setting`` (select's parameter dict) on ``split``."""
    if not setting:
        return None
    for row in fam.filter(pl.col("split") == split).iter_rows(named=True):
        params = json.loads(row["params"])
        if all(params.get(k) == v for k, v in setting.items()):
            return row
    return None


def _run_id(run_dir: str | None) -> str | None:
    """The run id of a run folder (``…/run=<id>``)."""
    name = Path(run_dir).name if run_dir else ""
    return name.split("=", 1)[1] if name.startswith("run=") else None


def _stored_timing(
    runs: TaskRuns, fam: pl.DataFrame, split: str, setting: str | None, alpha: float
) -> dict[str, Any] | None:
    """The paired timing pass of ``setting`` on ``split`` against its reference, if stored."""
    row = _first(fam.filter((pl.col("split") == split) & (pl.col("setting") == setting)))
    if row is None or row.get("reference_dir") is None:
        return None
    ref, cand = _run_id(row["reference_dir"]), _run_id(row["run_dir"])
    if ref is None or cand is None:
        return None
    timing = timing_for(runs.runs_dir, ref, cand, alpha=alpha)
    if timing is not None:  # the modelled numbers beside it may be another split's
        timing["label"] += f" (the {split} runs)"
    return timing


def _verdict(
    runs: TaskRuns, fam: pl.DataFrame, rule: str, **terms: Any
) -> tuple[Verdict | None, list[str], list[str]]:
    """``select.recommend``'s verdict on one family, or why there is none."""
    from relaxspec_audit.audit import select
    from relaxspec_audit.collect import logs

    ref_dirs = sorted({d for d in fam["reference_dir"].to_list() if d is not None})
    rel_dirs = fam["run_dir"].to_list()
    no_split = runs.split_note((terms["discovery"], terms["confirmation"]))
    if not ref_dirs:
        return None, [f"no paired {fam['reference'][0]} run to judge {rule} against"], []
    if no_split:
        return None, [no_split], []
    if not fam["accuracy_delta"].is_not_null().any():
        return (None, ["the task has no scorer: accuracy cannot be tested"],
                ["fidelity is shown by output divergence only"])  # fmt: skip
    settings = select.settings_frame([runs.manifest(d) for d in rel_dirs])
    requests = logs.scan(rel_dirs, "requests").collect().join(settings, on="run")
    # The reference's own cost of a pass: the modelled speed-up compares the two.
    ref_costs = select.settings_frame([runs.manifest(d) for d in ref_dirs])
    costs = ref_costs.select("run", select.PASS_COST, select.COST_TABLE, select.COST_NOTE)
    reference = logs.scan(ref_dirs, "requests").collect().join(costs, on="run", how="left")
    try:
        verdict = select.recommend(requests, reference, list(select.setting_params(rule)),
                                   **terms)  # fmt: skip
    except ValueError as exc:
        return None, [f"no verdict: {exc}"], []
    return verdict, list(verdict.reasons), []


def family_verdicts(
    runs: TaskRuns,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    discovery: str = "discovery",
    confirmation: str = "confirmation",
    min_items: int = 30,
    min_gain: float = 1.0,
    table: pl.DataFrame | None = None,
    timings: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
) -> list[FamilyVerdict]:
    """A verdict per relaxed rule: chosen on ``discovery``, judged on ``confirmation``.

    The choice and the verdict are ``select.recommend``'s (never ``PASS`` on fewer items
    than the power calculation asks for, nor without a modelled speed-up above
    ``min_gain``). A task without a scorer has no accuracy to test: its verdict is
    ``INCONCLUSIVE`` and its rows still show divergence and speed.

    Args:
        runs: the task's runs.
        ni_margin: non-inferiority margin δ (score units).
        alpha: 1 − confidence level and test level.
        discovery: split the setting is chosen on.
        confirmation: split the choice is judged on.
        min_items: never certify on fewer confirmation items than this.
        min_gain: PASS needs the modelled speed-up's lower bound above this.
        table: a precomputed :func:`~relaxspec_audit.audit.table.audit_table` (else computed).
        timings: paired timing-pass results keyed by ``(rule, setting label)``
            (``{"speedup", "ci_low", "ci_high", "label"}``), shown as the wall clock.
    """
    if table is None:
        table = audit_table(runs, ni_margin=ni_margin, alpha=alpha)
    terms = {
        "ni_margin": ni_margin, "alpha": alpha, "min_items": min_items, "min_gain": min_gain,
        "discovery": discovery, "confirmation": confirmation,
    }  # fmt: skip
    out = []
    relaxed = table.filter(~pl.col("is_reference"))
    for rule in relaxed["rule"].unique(maintain_order=True).to_list():
        fam = relaxed.filter(pl.col("rule") == rule)
        verdict, reasons, caveats = _verdict(runs, fam, rule, **terms)
        chosen = verdict.setting if verdict is not None else None
        rows = {s: _setting_row(fam, s, chosen) for s in (discovery, confirmation)}
        shown = (rows[discovery] or {}).get("setting")
        if chosen is None:
            # Nothing chosen: show the fastest setting's numbers, labelled as not chosen.
            label = fastest_setting(fam.filter(pl.col("split") == discovery))
            if label is not None:
                rows = {s: _first(fam.filter((pl.col("split") == s) & (pl.col("setting") == label)))
                        for s in (discovery, confirmation)}  # fmt: skip
                shown = label
        for split, row in rows.items():
            if row is not None and row.get("bound") is not None:
                if (row.get("identical_ci_high") or 0.0) < row["bound"]:
                    caveats.append(
                        f"{split}: measured identical-output rate is below the (1 − ε)^T bound"
                    )
        # Speed facts of the shown setting: confirmation when it has them, else discovery.
        split_shown = confirmation if rows[confirmation] else discovery
        is_ref = pl.col("is_reference") & (pl.col("rule") == fam["reference"][0])
        ref_row = _first(table.filter(is_ref & (pl.col("split") == split_shown)))
        if timings is not None:
            timing = timings.get((rule, shown))
        else:
            timing = _stored_timing(runs, fam, discovery, shown, alpha)
        speed = speed_facts(rows[split_shown], ref_row, timing, split=split_shown)
        disc_row = _first(fam.filter((pl.col("split") == discovery) & (pl.col("setting") == shown)))
        coupling = evidence.guarded(evidence.coupling_facts, runs, disc_row,
                                    ni_margin=ni_margin, alpha=alpha)  # fmt: skip
        # Fidelity evidence on the split the numbers are shown for.
        shown_row = _first(fam.filter((pl.col("split") == split_shown)
                                      & (pl.col("setting") == shown)))  # fmt: skip
        floor = attribution = loglik = None
        if shown_row is not None and shown_row.get("reference_dir"):
            rel_dir, ref_dir = shown_row["run_dir"], shown_row["reference_dir"]
            floor = evidence.guarded(evidence.floor_facts, runs, shown_row, alpha=alpha)
            attribution = evidence.guarded(evidence.attribution_facts, rel_dir, ref_dir, rule,
                                           alpha=alpha)  # fmt: skip
            loglik = evidence.guarded(evidence.loglik_facts, rel_dir, ref_dir, alpha=alpha)
        out.append(
            FamilyVerdict(
                rule=rule,
                reference=fam["reference"][0],
                knob=fam["knob"][0],
                verdict=verdict.status if verdict is not None else "INCONCLUSIVE",
                chosen=chosen,
                setting=shown if chosen else None,
                shown_setting=shown,
                discovery=setting_row(rows[discovery]),
                confirmation=setting_row(rows[confirmation]),
                frontier=[
                    setting_row(r)
                    for r in fam.filter(pl.col("split") == discovery)
                    .sort("value")
                    .iter_rows(named=True)
                ],
                speed=speed,
                noise_floor=floor,
                attribution=attribution,
                loglik=loglik,
                coupling=coupling,
                reasons=reasons,
                caveats=caveats,
                n_required=verdict.n_required if verdict is not None else None,
                select=verdict,
                headline=headline(verdict, reasons),
            )
        )
    return out


def audit_task(
    runs_dir: str | Path,
    task: str,
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    min_gain: float = 1.0,
    parameters: Mapping[str, Any] | None = None,
    table: pl.DataFrame | None = None,
    runs: TaskRuns | None = None,
) -> TaskAudit:
    """The audit of one task: its verdicts and evidence (``summary.json``, docs/REPORTS.md).

    Args:
        runs_dir: folder of run folders.
        task: task name (or JSONL path).
        ni_margin: non-inferiority margin δ (score units).
        alpha: 1 − confidence level.
        min_gain: the minimum modelled speed-up over the reference that PASS needs.
        parameters: the task's notebook parameters; ``ni_margin``, ``alpha`` and
            ``min_gain`` are read from here when given.
        table: a precomputed :func:`~relaxspec_audit.audit.table.audit_table`.
        runs: the task's runs, when already read.

    Returns:
        The task audit. A failure of the verdicts or of the anatomy is recorded in its
        ``errors`` (status ``failed``) or its anatomy's ``error``; it never raises for a
        task whose runs can be read.
    """
    from relaxspec_audit import __version__
    from relaxspec_audit.audit.task_anatomy import anatomy_block, ratio_test_rule

    parameters = dict(parameters or {})
    ni_margin = float(parameters.get("ni_margin", ni_margin))
    alpha = float(parameters.get("alpha", alpha))
    min_gain = float(parameters.get("min_gain", min_gain))
    errors: list[str] = []
    families: list[FamilyVerdict] = []
    facts = None
    try:
        runs = runs or TaskRuns.load(runs_dir, task)
        families = family_verdicts(runs, ni_margin=ni_margin, alpha=alpha, min_gain=min_gain,
                                   table=table)  # fmt: skip
        facts = runs.facts()
    except Exception as exc:  # the summary must still be written, saying what failed
        errors.append(f"summary: {type(exc).__name__}: {exc}")
    try:
        if runs is None:
            raise ValueError("the runs could not be read")
        anatomy = anatomy_block(runs, alpha=alpha)
    except Exception as exc:  # evidence beside the verdicts: its failure shows in the block
        error = f"{type(exc).__name__}: {exc}"
        anatomy = AnatomyBlock(rule=ratio_test_rule(), alpha=alpha, runs=[],
                               note=f"not computed: {error}", error=error)  # fmt: skip
    return TaskAudit(
        batch=None,
        task=task,
        task_slug=task_slug(task),
        generated_at=_now(),
        package_version=__version__,
        status="failed" if errors else "ok",
        ni_margin=ni_margin,
        alpha=alpha,
        min_gain=min_gain,
        families=families,
        rejection_anatomy=anatomy,
        manifest=facts,
        n_runs=facts.n_runs if facts is not None else None,
        errors=errors,
    )


def finish(
    audit: TaskAudit,
    *,
    batch: str | None = None,
    errors: Sequence[str] = (),
    notebooks: Sequence[NotebookEntry | Mapping[str, Any]] = (),
    n_runs: int | None = None,
    pages: Mapping[str, str] | None = None,
) -> TaskAudit:
    """A task audit with a batch's facts added: its name, errors, notebooks, explorer pages.

    ``status`` is ``failed`` when the audit or the batch recorded an error or any notebook
    failed, else ``ok``.
    """
    entries = [*audit.notebooks, *(NotebookEntry.model_validate(n) for n in notebooks)]
    all_errors = [*audit.errors, *errors]
    families = [
        f.model_copy(update={"divergence_html": pages.get(f.rule)}) if pages else f
        for f in audit.families
    ]
    failed = all_errors or any(not nb.ok for nb in entries)
    return audit.model_copy(
        update={
            "batch": batch if batch is not None else audit.batch,
            "errors": all_errors,
            "notebooks": entries,
            "n_runs": n_runs if n_runs is not None else audit.n_runs,
            "families": families,
            "status": "failed" if failed else "ok",
        }
    )
