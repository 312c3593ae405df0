"""Markdown of a task's audit for the notebooks: choices, the sign-off page, manifest facts.

Rendered from the typed results (:mod:`relaxspec_audit.audit.results`), never from logs.
Every value that comes from a summary, a manifest or a config (task names, model paths,
rule settings, reasons, errors) goes through :func:`~.format._md`: the markdown is
rendered to HTML with raw tags passed through, so an unescaped ``<script>`` in a model
folder's name would be live in the exported page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relaxspec_audit.audit.results import FamilyVerdict, ManifestFacts, TaskAudit
from relaxspec_audit.report.format import _iv, _md, _pct, _points, _speed, accuracy_pair, yes_no


def choices_markdown(families: Sequence[FamilyVerdict]) -> str:
    """Markdown table of the family verdicts: choice, discovery and confirmation numbers."""
    if not families:
        return "_No relaxed rule among the runs: nothing to choose._"
    lines = [
        "| rule | verdict | chosen | split | N | modelled speed-up vs ref. [CI] | τ "
        "| accuracy | accuracy Δ [CI] | non-inferior | divergence |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in families:
        for split in ("discovery", "confirmation"):
            row = getattr(f, split)
            lines.append(
                f"| {_md(f.rule)} vs {_md(f.reference)} | **{_md(f.verdict)}** "
                f"| {_md(f.setting or '–')} "
                f"| {split} | {'–' if not row else _md(row.n_requests)} "
                f"| {_speed(row)} "
                f"| {'–' if not row or row.tau is None else format(row.tau, '.2f')} "
                f"| {accuracy_pair(row)} | {_points(row)} "
                f"| {'–' if not row else yes_no(row.noninferior)} "
                f"| {_pct(row.divergence) if row else '–'} |"
            )
    notes = [f"- {_md(f.rule)}: {_md(r)}" for f in families for r in [*f.reasons, *f.caveats]]
    return "\n".join(lines + (["", *notes] if notes else []))


def _evidence(fam: FamilyVerdict) -> list[str]:
    """The evidence lines beside a verdict: speed in words, noise floor, attribution, …."""
    out = []
    speed = fam.speed
    modelled = speed.modelled
    basis = f", {_md(modelled.basis)}" if modelled.basis else ""
    out.append(
        f"- modelled speed-up over {_md(fam.reference)} ({_md(speed.split or '')}"
        f"{basis}): {_iv(modelled)}"
    )
    if speed.wall_clock:
        out.append(f"- wall clock: {_iv(speed.wall_clock)} — {_md(speed.wall_clock.label)}")
    if modelled.note:
        out.append(f"- speed note: {_md(modelled.note)}")
    out.append(f"- over target-only decoding: {_iv(speed.vs_target)} (modelled)")
    out.append(f"- {_md(speed.sentence)}")
    for label, block in (("noise floor", fam.noise_floor),
                         ("where outputs changed", fam.attribution),
                         ("likelihood", fam.loglik), ("coupling", fam.coupling)):  # fmt: skip
        if block is not None and block.sentence:
            out.append(f"- {label}: {_md(block.sentence)}")
    return out


def signoff_markdown(audit: TaskAudit) -> str:
    """The one-page sign-off text of a task audit: verdicts, numbers, caveats."""
    out = [
        # <code>, not a code span: a backtick in the name would end a code span early.
        f"# Sign-off: <code>{_md(audit.task)}</code>",
        "",
        "The record for deploying a relaxed rule on this task: per rule, the verdict, the "
        "setting chosen on the discovery split and what it measured on the confirmation split "
        "against its lossless reference, the caveats, and how the runs were made. "
        "`summary.json` beside this page holds the same numbers.",
        "",
        f"Non-inferiority margin δ = {100 * audit.ni_margin:g} points, "
        f"{100 * (1 - audit.alpha):g}% intervals, minimum gain "
        f"{audit.min_gain:g}× (modelled speed-up over the reference, lower "
        f"bound). Status: **{_md(audit.status)}**.",
    ]
    for warning in audit.manifest.cost_warnings if audit.manifest else ():
        out += ["", f"**Flagged cost table**: {_md(warning)}. Every modelled speed-up on "
                "this page is priced from it and may be wrong; recalibrate on a quiet "
                "machine."]  # fmt: skip
    if not audit.families:
        out += ["", "_No relaxed rule was audited for this task._"]
    for fam in audit.families:
        conf = fam.confirmation
        out += [
            "",
            f"## {_md(fam.rule)} vs {_md(fam.reference)}: **{_md(str(fam.verdict).upper())}**",
            "",
            f"- chosen {_md(fam.knob)}: **{_md(fam.setting or 'none')}** (on the discovery split)",
        ]
        if not fam.setting and fam.shown_setting:
            out.append(
                f"- numbers below: the fastest setting, {_md(fam.shown_setting)} (not chosen)"
            )
        if fam.n_required:
            out.append(f"- items per split needed for a powered decision: {_md(fam.n_required)}")
        out += _evidence(fam)
        if conf and conf.tau is not None:
            ref_tau = conf.tau_reference if conf.tau_reference is not None else float("nan")
            out.append(f"- tokens per target pass τ: {conf.tau:.2f} (reference {ref_tau:.2f})")
        out += [
            "- accuracy (confirmation"
            + (f", {_md(conf.n_requests)} requests" if conf and conf.n_requests else "")
            + f"): {accuracy_pair(conf)}",
            f"- accuracy delta (confirmation): {_points(conf)}",
            "- outputs differing from the reference: " + (_pct(conf.divergence) if conf else "–"),
        ]
        if conf and conf.bound is not None:
            out.append(
                f"- (1 − ε)^T bound {_pct(conf.bound)} vs measured identical "
                f"{_pct(conf.identical_rate)}"
            )
        out += [f"- why: {_md(r)}" for r in fam.reasons]
        out += [f"- caveat: {_md(c)}" for c in fam.caveats]
    out += [f"- **error**: {_md(e)}" for e in audit.errors]
    return "\n".join(out)


def _plain(value: Any) -> str:
    """A manifest value as words: ``{'complete': 16}`` → ``complete: 16``, lists joined."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    return "–" if value is None else str(value)


def manifest_markdown(facts: ManifestFacts | None) -> str:
    """The manifest facts a sign-off states: models, revisions, seeds, versions, commit."""
    if facts is None:
        return "_No manifest facts (no runs)._"
    lines = ["| fact | value |", "| --- | --- |"]
    for i, models in enumerate(facts.models):
        for role in ("target", "draft"):
            info = models.get(role)
            if not info:  # target-only runs load no draft
                continue
            if isinstance(info, Mapping):
                desc = ", ".join(
                    f"{_md(k)}: {_md(v)}" for k, v in info.items() if not isinstance(v, dict)
                )
            else:
                desc = _md(info)
            lines.append(f"| {role} model{f' ({i + 1})' if i else ''} | {desc} |")
    for key in ("seeds", "k", "temperatures", "max_new_tokens", "package_version",
                "git_commit", "hosts", "n_runs", "statuses", "started_at", "ended_at"):  # fmt: skip
        lines.append(f"| {key.replace('_', ' ')} | {_md(_plain(getattr(facts, key)))} |")
    for v in facts.versions:
        lines.append(f"| versions | {', '.join(f'{_md(k)} {_md(x)}' for k, x in v.items())} |")
    return "\n".join(lines)
