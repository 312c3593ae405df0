"""Markdown of a task's audit for the notebooks: choices, the sign-off page, manifest facts.

Every value that comes from a summary, a manifest or a config (task names, model paths,
rule settings, reasons, errors) goes through :func:`~.format._md`: the markdown is
rendered to HTML with raw tags passed through, so an unescaped ``<script>`` in a model
folder's name would be live in the exported page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relaxspec_audit.report.format import (
    _iv,
    _md,
    _pct,
    _points,
    _speed,
    accuracy_pair,
    reason_text,
    yes_no,
)


def choices_markdown(choices: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of :func:`recommend` results: choice, discovery and confirmation numbers."""
    if not choices:
        return "_No relaxed rule among the runs: nothing to choose._"
    lines = [
        "| rule | verdict | chosen | split | N | modelled speed-up vs ref. [CI] | τ "
        "| accuracy | accuracy Δ [CI] | non-inferior | divergence |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in choices:
        for split in ("discovery", "confirmation"):
            row = c.get(split)
            lines.append(
                f"| {_md(c['rule'])} vs {_md(c['reference'])} | **{_md(c['verdict'])}** "
                f"| {_md(c.get('setting') or '–')} "
                f"| {split} | {'–' if not row else _md(row.get('n_requests', '–'))} "
                f"| {_speed(row)} "
                f"| {'–' if not row or row.get('tau') is None else format(row['tau'], '.2f')} "
                f"| {accuracy_pair(row)} | {_points(row)} "
                f"| {'–' if not row else yes_no(row.get('noninferior'))} "
                f"| {_pct(row.get('divergence')) if row else '–'} |"
            )
    notes = [
        f"- {_md(c['rule'])}: {_md(reason_text(r))}"
        for c in choices
        for r in [*c["reasons"], *c["caveats"]]
    ]
    return "\n".join(lines + (["", *notes] if notes else []))


def signoff_markdown(summary: Mapping[str, Any]) -> str:
    """The one-page sign-off text of a task summary: verdicts, numbers, caveats."""
    out = [
        # <code>, not a code span: a backtick in the name would end a code span early.
        f"# Sign-off: <code>{_md(summary['task'])}</code>",
        "",
        "The record for deploying a relaxed rule on this task: per rule, the verdict, the "
        "setting chosen on the discovery split and what it measured on the confirmation split "
        "against its lossless reference, the caveats, and how the runs were made. "
        "`summary.json` beside this page holds the same numbers.",
        "",
        f"Non-inferiority margin δ = {100 * summary['ni_margin']:g} points, "
        f"{100 * (1 - summary['alpha']):g}% intervals, minimum gain "
        f"{summary.get('min_gain', 1.0):g}× (modelled speed-up over the reference, lower "
        f"bound). Status: **{_md(summary['status'])}**.",
    ]
    if not summary.get("families"):
        out += ["", "_No relaxed rule was audited for this task._"]
    for fam in summary.get("families", []):
        conf = fam.get("confirmation")
        out += [
            "",
            f"## {_md(fam['rule'])} vs {_md(fam['reference'])}: "
            f"**{_md(str(fam['verdict']).upper())}**",
            "",
            f"- chosen {_md(fam['knob'])}: **{_md(fam.get('setting') or 'none')}** "
            "(on the discovery split)",
        ]
        if not fam.get("setting") and fam.get("shown_setting"):
            out.append(
                f"- numbers below: the fastest setting, {_md(fam['shown_setting'])} (not chosen)"
            )
        if fam.get("n_required"):
            out.append(f"- items per split needed for a powered decision: {_md(fam['n_required'])}")
        speed = fam.get("speed") or {}
        modelled = speed.get("modelled") or {}
        basis = f", {_md(modelled['basis'])}" if modelled.get("basis") else ""
        out.append(
            f"- modelled speed-up over {_md(fam['reference'])} ({_md(speed.get('split', ''))}"
            f"{basis}): {_iv(modelled)}"
        )
        if speed.get("wall_clock"):
            wall = speed["wall_clock"]
            out.append(f"- wall clock: {_iv(wall)} — {_md(wall['label'])}")
        out.append(f"- over target-only decoding: {_iv(speed.get('vs_target'))} (modelled)")
        if speed.get("sentence"):
            out.append(f"- {_md(speed['sentence'])}")
        floor = fam.get("noise_floor") or {}
        if floor.get("sentence"):
            out.append(f"- noise floor: {_md(floor['sentence'])}")
        attribution = fam.get("attribution") or {}
        if attribution.get("sentence"):
            out.append(f"- where outputs changed: {_md(attribution['sentence'])}")
        loglik = fam.get("loglik") or {}
        if loglik.get("sentence"):
            out.append(f"- likelihood: {_md(loglik['sentence'])}")
        coupling = fam.get("coupling") or {}
        if coupling.get("sentence"):
            out.append(f"- coupling: {_md(coupling['sentence'])}")
        if conf and conf.get("tau") is not None:
            out.append(
                f"- tokens per target pass τ: {conf['tau']:.2f} "
                f"(reference {conf.get('tau_reference') or float('nan'):.2f})"
            )
        out += [
            "- accuracy (confirmation"
            + (f", {_md(conf['n_requests'])} requests" if conf and conf.get("n_requests") else "")
            + f"): {accuracy_pair(conf)}",
            f"- accuracy delta (confirmation): {_points(conf)}",
            "- outputs differing from the reference: "
            + (_pct(conf.get("divergence")) if conf else "–"),
        ]
        if conf and conf.get("bound") is not None:
            out.append(
                f"- (1 − ε)^T bound {_pct(conf['bound'])} vs measured identical "
                f"{_pct(conf.get('identical_rate'))}"
            )
        for r in fam.get("reasons", []):
            out.append(f"- why: {_md(reason_text(r))}")
        for c in fam.get("caveats", []):
            out.append(f"- caveat: {_md(reason_text(c))}")
    for e in summary.get("errors", []):
        out.append(f"- **error**: {_md(e)}")
    return "\n".join(out)


def _plain(value: Any) -> str:
    """A manifest value as words: ``{'complete': 16}`` → ``complete: 16``, lists joined."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    return "–" if value is None else str(value)


def manifest_markdown(facts: Mapping[str, Any]) -> str:
    """The manifest facts a sign-off states: models, revisions, seeds, versions, commit."""
    if not facts:
        return "_No manifest facts (no runs)._"
    lines = ["| fact | value |", "| --- | --- |"]
    for i, models in enumerate(facts.get("models", [])):
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
        lines.append(f"| {key.replace('_', ' ')} | {_md(_plain(facts.get(key)))} |")
    for v in facts.get("versions", []):
        lines.append(f"| versions | {', '.join(f'{_md(k)} {_md(x)}' for k, x in v.items())} |")
    return "\n".join(lines)
