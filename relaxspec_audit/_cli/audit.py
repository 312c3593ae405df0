"""``relaxspec-audit audit``: audit statistics of run folders, as JSON or a table.

The statistics are computed by :func:`relaxspec_audit.stats.audit_summary` (the same
function notebooks and the batch runner call); this module only parses and prints.
"""

from __future__ import annotations

from typing import Any

import click


def _theta_grid(ctx: click.Context, param: click.Parameter, value: str | None):
    """Parse ``0.5,0.9,0.95`` (commas and/or spaces) into a tuple of θ in (0, 1]."""
    if value is None:
        return None
    out = []
    for tok in value.replace(",", " ").split():
        try:
            theta = float(tok)
        except ValueError:
            raise click.BadParameter(f"{tok!r} is not a number", ctx, param) from None
        if not 0 < theta <= 1:  # nan and inf too
            raise click.BadParameter(f"{tok} is not in (0, 1]", ctx, param)
        out.append(theta)
    if not out:
        raise click.BadParameter("give at least one θ, e.g. 0.8,0.9,0.95", ctx, param)
    return tuple(out)


def _notebook_value(name: str):
    """A click callback checking an option as the notebooks check parameter ``name``.

    ``report.validate_parameters`` is the one checker of notebooks, batch configs and
    this command, so ``--ni-margin 5`` (500 points) or ``--alpha nan`` is a usage error
    here exactly as ``ni_margin: 5`` is in a config.
    """

    def check(ctx: click.Context, param: click.Parameter, value: float | None):
        if value is None:
            return None
        from relaxspec_audit.report.parameters import validate_parameters

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
    kv("runs", ", ".join(str(r) for r in s.get("runs", [])) or "–")
    kv("rules", ", ".join(s.get("rules", [])) or "–")
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
    kv("acceptance rate α", _fmt(s["acceptance_rate"]))
    kv("mean K", _fmt(s["k_mean"]))
    kv("verification share of time (wall clock)", _fmt(s["verify_share"]))
    kv("target passes per token", _fmt(s.get("passes_per_token")))
    kv("tokens / s (wall clock)", _fmt(s.get("tokens_per_s")))
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
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--reference",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Reference run (exact for NSD, strict greedy for ASD): adds paired statistics.",
)
@click.option(
    "--baseline",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Target-only run: adds the speedup over autoregressive decoding.",
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
    "--margin",
    "old_margin",
    type=float,
    default=None,
    hidden=True,  # deprecated
    callback=_notebook_value("ni_margin"),
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
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON summary.")
@click.option(
    "--no-verify",
    is_flag=True,
    help="Skip checking the logs against their commit records and value ranges (faster).",
)
def audit(
    run_dirs: tuple[str, ...],
    reference: str | None,
    baseline: str | None,
    theta_grid: tuple[float, ...] | None,
    ni_margin: float,
    old_margin: float | None,
    alpha: float,
    correction: str,
    as_json: bool,
    no_verify: bool,
) -> None:
    """Audit statistics over one or more RUN_DIRS (run folders or their parents)."""
    from relaxspec_audit import stats
    from relaxspec_audit.collect.logs import LogError

    if old_margin is not None:
        ctx = click.get_current_context()
        if ctx.get_parameter_source("ni_margin") is click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("give --ni-margin only (--margin is its deprecated name)")
        click.echo(
            "Warning: --margin is deprecated, use --ni-margin (the non-inferiority margin δ; "
            "`margin` is a verification rule)",
            err=True,
        )
        ni_margin = old_margin

    try:
        summary = stats.audit_summary(
            list(run_dirs),
            reference=[reference] if reference else None,
            baseline=[baseline] if baseline else None,
            theta_grid=theta_grid,
            ni_margin=ni_margin,
            alpha=alpha,
            correction=correction,
            verify=not no_verify,
        )
    except (LogError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(stats.summary_json(summary) if as_json else format_table(summary))
