"""``relaxspec-audit audit``: audit statistics of run folders, as text, JSON, CSV or markdown.

The statistics are computed by :func:`relaxspec_audit.audit.summary.audit_summary` (the same
function notebooks and the batch runner call); this module parses, refuses a selection
that mixes settings (``audit.runs.check_one_setting``) and prints.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import click

#: Output formats of ``--format`` (``--json`` is the old spelling of ``--format json``).
FORMATS = ("text", "json", "csv", "md")


def _folders(ctx: click.Context, param: click.Parameter, values: Any):
    """Run folders from paths or glob patterns, each pattern expanded as a shell would.

    A quoted pattern (``--reference 'runs/task=arith/rule=exact/run=*'``) is expanded
    here, so that all its matches stay with the option that named them instead of the
    shell spilling the extra matches into RUN_DIRS.
    """
    if values is None:
        return ()
    out: list[str] = []
    for value in (values,) if isinstance(values, str) else values:
        if Path(value).is_dir():
            out.append(value)
            continue
        if Path(value).exists():
            raise click.BadParameter(f"{value!r} is not a folder", ctx, param)
        if not glob.has_magic(value):
            raise click.BadParameter(f"folder {value!r} does not exist", ctx, param)
        matches = sorted(m for m in glob.glob(value) if Path(m).is_dir())
        if not matches:
            raise click.BadParameter(f"no folder matches {value!r}", ctx, param)
        # A pattern is a scan, like a parent folder: replica runs (noise floor, coupling)
        # repeat a main run's items and would be counted twice; name one to audit it.
        from relaxspec_audit.collect.reader import _is_replica

        matches = [m for m in matches if not _is_replica(Path(m))] or matches
        out.extend(matches)
    return tuple(out)


def _theta_grid(ctx: click.Context, param: click.Parameter, value: str | None):
    """Parse ``0.5,0.9,0.95`` (commas and/or spaces) into a tuple of θ in (0, 1]."""
    if value is None:
        return None
    from relaxspec_audit.verify.params import bad_thetas

    out = []
    for tok in value.replace(",", " ").split():
        try:
            theta = float(tok)
        except ValueError:
            raise click.BadParameter(f"{tok!r} is not a number", ctx, param) from None
        if bad_thetas([theta]):  # nan and inf too
            raise click.BadParameter(f"{tok} is not in (0, 1]", ctx, param)
        out.append(theta)
    if not out:
        raise click.BadParameter("give at least one θ, e.g. 0.8,0.9,0.95", ctx, param)
    return tuple(out)


def _notebook_value(name: str):
    """A click callback checking an option as the notebooks check parameter ``name``.

    ``batch.validate_parameters`` is the one checker of notebooks, batch configs and
    this command, so ``--ni-margin 5`` (500 points) or ``--alpha nan`` is a usage error
    here exactly as ``ni_margin: 5`` is in a config.
    """

    def check(ctx: click.Context, param: click.Parameter, value: float | None):
        if value is None:
            return None
        from relaxspec_audit.batch.parameters import validate_parameters

        try:
            validate_parameters(**{name: value})
        except ValueError as exc:
            raise click.BadParameter(str(exc).removeprefix(f"{name}: "), ctx, param) from None
        return value

    return check


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _ci(d: dict[str, Any], lo: str = "ci_low", hi: str = "ci_high") -> str:
    return f"[{_fmt(d.get(lo))}, {_fmt(d.get(hi))}]"


def format_table(s: dict[str, Any]) -> str:
    """A readable plain-text rendering of an ``audit_summary`` dict."""
    lines: list[str] = []

    def section(title: str) -> None:
        lines.append("")
        lines.append(title)
        lines.append("-" * len(title))

    def kv(key: str, value: str) -> None:
        lines.append(f"  {key:<28} {value}")

    lines.append(f"relaxspec-audit summary (schema {s['schema_version']})")
    kv("task", s.get("task") or ", ".join(s.get("tasks") or []) or "–")
    rule = s.get("rule") or {}
    kv("setting", rule.get("label") or ", ".join(s.get("rules", [])) or "–")
    kv("runs", ", ".join(str(r) for r in s.get("runs", [])) or "–")
    ref = s.get("reference") or {}
    if ref:
        label = (ref.get("rule") or {}).get("label") or "–"
        kv("reference", f"{label}: {', '.join(map(str, ref.get('runs') or []))}")
    models = s.get("models") or {}
    for role in ("target", "draft"):
        if models.get(role):
            kv(role, _fmt(models[role].get("path")))
    kv("requests / positions", f"{s['n_requests']} / {s['n_positions']}")
    if not s.get("verified", True):
        kv("UNVERIFIED logs", ", ".join(s.get("unverified_runs", [])) or "–")

    section("Rejected drafts inside the θ nucleus (95% CI, clustered by request)")
    for r in s["rejected_in_nucleus"]:
        kv(f"θ = {r['theta']}", f"{_fmt(r['fraction'])} {_ci(r)}  n = {r['n_rejected']}")
    for r in s["topk_share"]:
        kv(f"in target top-{r['k']}", f"{_fmt(r['fraction'])} {_ci(r)}")

    section("Entropy (nats): draft H(q), target H(p), gap H(q) − H(p)")
    for subset, e in s["entropy"].items():
        kv(
            subset,
            f"H(q) {_fmt(e['entropy_q'])}  H(p) {_fmt(e['entropy_p'])}  "
            f"gap {_fmt(e['gap'])} {_ci(e, 'gap_ci_low', 'gap_ci_high')}  n = {e['n_positions']}",
        )

    section("Speed")
    kv("tau (tokens / target pass)", f"{_fmt(s['tau_mean'])} [{', '.join(map(_fmt, s['tau_ci']))}]")
    kv("acceptance_rate α (Σ accepted / Σ reached)", _fmt(s["acceptance_rate"]))
    kv("mean K", _fmt(s["k_mean"]))
    kv("verification share of time (wall clock)", _fmt(s["verify_share"]))
    kv("target passes per token", _fmt(s.get("passes_per_token")))
    kv("tokens / s (wall clock)", _fmt(s.get("tokens_per_s")))
    for warning in s.get("cost_warnings", []):
        kv("FLAGGED cost table", warning)
    versus = (("speedup_vs_reference", "reference"), ("speedup_vs_baseline", "target-only"))
    for key, label in versus:
        if key in s:
            m = s[key]
            basis = m.get("basis")
            kv(f"speed-up vs {label} (modelled, {basis})", f"{_fmt(m['speedup'])} {_ci(m)}")
            if m.get("note"):
                kv("  note", m["note"])
            w = s.get(f"wall_{key}")
            if w:
                kv(f"speed-up vs {label} (wall clock)", f"{_fmt(w['speedup'])} {_ci(w)}")

    if "accuracy_delta" in s:
        a = s["accuracy_delta"]
        section(f"Accuracy delta vs reference (non-inferiority margin δ = {a['ni_margin']})")
        kv("delta (pooled)", f"{_fmt(a['delta'])} {_ci(a)}  items = {a['n_items']}")
        kv("McNemar exact p", _fmt(a["p_mcnemar"]))
        kv("non-inferiority p", f"{_fmt(a['p_noninferiority'])}  ({_fmt(a['noninferior'])})")
        for t in a.get("per_task", []):
            kv(
                f"task {t.get('task', '')}",
                f"{_fmt(t['delta'])} {_ci(t)}  p_noninf(adj) {_fmt(t['p_noninf_adj'])}",
            )
    if "hash_divergence" in s:
        h = s["hash_divergence"]
        section("Hash divergence vs reference (Wilson 95% CI)")
        kv("diverged requests", f"{_fmt(h['rate'])} {_ci(h)}  ({h['n_diverged']} of {h['n']})")
        kv("first divergent position", f"median {_fmt(h['first_pos_median'])}")
    if "deviation" in s:
        d = s["deviation"]
        section(f"Deviation accounting at θ = {d['theta']} (THEORY §2.3)")
        kv("mean ε per request", _fmt(d["eps_mean"]))
        kv("bound Π(1 − ε_t), mean", _fmt(d["bound_product"]))
        kv("identical-output rate", f"{_fmt(d.get('identical_rate'))} {_ci(d)}")
    if "counterfactual_nsd_first_order" in s:
        section("Counterfactual NSD from this exact run (FIRST-ORDER replay)")
        for r in s["counterfactual_nsd_first_order"]:
            kv(
                f"θ = {r['theta']}",
                f"accept {_fmt(r['accept_rate_fo'])}  tau {_fmt(r['tau_fo'])}  "
                f"E_S {_fmt(r['es_mean_fo'])}",
            )
    return "\n".join(lines)


@click.command("audit")
@click.argument("run_dirs", nargs=-1, required=True, callback=_folders)
@click.option(
    "--reference",
    multiple=True,
    callback=_folders,
    help="Reference run(s) of one setting (exact for NSD, strict greedy for ASD), a folder "
    "or a quoted glob; repeat for several splits. Adds paired statistics.",
)
@click.option(
    "--baseline",
    multiple=True,
    callback=_folders,
    help="Target-only run(s), a folder or a quoted glob: adds the speed-up over "
    "autoregressive decoding.",
)
@click.option(
    "--theta-grid",
    callback=_theta_grid,
    default=None,
    help="θ values, e.g. 0.5,0.8,0.9,0.95 (default: the runs' es grid).",
)
@click.option(
    "--ni-margin",
    type=float,
    default=0.02,
    show_default=True,
    callback=_notebook_value("ni_margin"),
    help="Non-inferiority margin δ, a fraction of the score in [0, 1) (0.02 = 2 points).",
)
@click.option(
    "--alpha",
    type=float,
    default=0.05,
    show_default=True,
    callback=_notebook_value("alpha"),
    help="1 − confidence, in (0, 1).",
)
@click.option(
    "--correction",
    type=click.Choice(["holm", "fdr_bh"]),
    default="holm",
    show_default=True,
    help="Multiple-testing correction across tasks.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="text (default), json (the versioned summary), csv or md (one row of headline "
    "numbers, relaxspec_audit.report.tables).",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--no-verify",
    is_flag=True,
    help="Skip checking the logs against their commit records and value ranges (faster).",
)
def audit(
    run_dirs: tuple[str, ...],
    reference: tuple[str, ...],
    baseline: tuple[str, ...],
    theta_grid: tuple[float, ...] | None,
    ni_margin: float,
    alpha: float,
    correction: str,
    fmt: str | None,
    as_json: bool,
    no_verify: bool,
) -> None:
    """Audit statistics over one or more RUN_DIRS (run folders, their parents, or globs).

    The runs, and the references, must each be one setting (rule, resolved parameters,
    pair, sampling settings); one setting's runs on several splits or seeds pool.
    """
    from relaxspec_audit import audit as stats
    from relaxspec_audit.collect.logs import LogError

    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"give --format {fmt} or --json (= --format json), not both")
    fmt = "json" if as_json else (fmt or "text")

    try:
        _check_selection(run_dirs, reference, baseline)
        summary = stats.audit_summary(
            list(run_dirs),
            reference=list(reference) or None,
            baseline=list(baseline) or None,
            theta_grid=theta_grid,
            ni_margin=ni_margin,
            alpha=alpha,
            correction=correction,
            verify=not no_verify,
        )
    except (LogError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if fmt != "text":  # the text table shows them in its speed section
        for warning in summary.get("cost_warnings", []):
            click.echo(f"warning: {warning}: the modelled speed-ups may be wrong", err=True)
    click.echo(render(summary, fmt), nl=fmt == "text" or fmt == "json")


def render(summary: dict[str, Any], fmt: str) -> str:
    """An ``audit_summary`` dict in one of :data:`FORMATS`."""
    from relaxspec_audit import audit as stats
    from relaxspec_audit.report import tables

    if fmt == "json":
        return stats.summary_json(summary)
    if fmt == "csv":
        return tables.rows_csv(tables.audit_rows(summary), tables.AUDIT_COLUMNS)
    if fmt == "md":
        return tables.audit_markdown(summary)
    return format_table(summary)


def _check_selection(
    run_dirs: tuple[str, ...], reference: tuple[str, ...], baseline: tuple[str, ...]
) -> None:
    """Refuse RUN_DIRS, references or baselines that mix settings (ValueError, runs named).

    RUN_DIRS mixing the reference's setting with another is the trace of an unquoted
    ``--reference`` glob whose extra matches the shell handed to RUN_DIRS: said so, with
    the fix. (RUN_DIRS all of the reference's setting is a deliberate comparison.)
    """
    import json

    from relaxspec_audit.audit.runs import check_one_setting, setting_key
    from relaxspec_audit.collect import logs

    def blob(key: Any) -> str:
        return json.dumps(key, sort_keys=True, default=str)

    ref_key = check_one_setting(reference, "--reference") if reference else None
    try:
        check_one_setting(run_dirs, "RUN_DIRS")
    except ValueError as exc:
        spilled = [
            logs.read_manifest(d).run_id
            for d in logs.find_runs(run_dirs)
            if ref_key is not None and blob(setting_key(logs.read_manifest(d))) == blob(ref_key)
        ]
        if not spilled:
            raise
        raise ValueError(
            f"{exc}. RUN_DIRS hold run={', run='.join(map(str, spilled))} of the --reference "
            "setting: did an unquoted --reference glob match several runs? Quote the glob "
            "(--reference 'runs/task=…/rule=exact/run=*') or repeat --reference, so that "
            "every match is a reference"
        ) from None
    if baseline:
        check_one_setting(baseline, "--baseline")
