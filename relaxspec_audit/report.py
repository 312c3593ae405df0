"""Reports: ``summary.json`` per task, HTML export of executed notebooks, ``index.html``.

Everything here writes static, self-contained files: HTML with inline CSS, figures as
inline PNG (nbconvert's ``basic`` template), no scripts and no external resources, so a
report opens offline and can be archived with the sign-off.

``summary.json`` (schema :data:`SUMMARY_SCHEMA_VERSION`, documented in ``docs/REPORTS.md``)
holds the verdict per relaxed rule family and the numbers behind it; the batch runner
writes it and the ``signoff`` notebook renders the same dict (:func:`task_summary`).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Name and version of the ``summary.json`` schema; bump the version on any rename,
#: retype or removal of a field (adding fields is fine). See docs/REPORTS.md.
SUMMARY_SCHEMA = "relaxspec_audit.summary"
SUMMARY_SCHEMA_VERSION = 1

_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --soft: #f6f8fa;
        --go: #1a7f37; --nogo: #cf222e; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); }
main { max-width: 980px; margin: 0 auto; padding: 16px 24px 48px; }
nav { background: var(--soft); border-bottom: 1px solid var(--line); padding: 8px 24px; }
nav a { margin-right: 14px; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
h1 { font-size: 1.6em; margin: 0.6em 0 0.3em; } h2 { font-size: 1.3em; margin-top: 1.4em; }
h3 { font-size: 1.1em; }
.anchor-link { display: none; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.92em; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: var(--soft); padding: 8px 10px; overflow-x: auto; font-size: 0.86em;
      border-radius: 4px; white-space: pre-wrap; }
img { max-width: 100%; height: auto; }
.output_stderr pre { background: #fff8c5; }
.output_error pre { background: #ffebe9; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600;
         font-size: 0.85em; color: #fff; background: var(--muted); }
.badge.PASS { background: var(--go); } .badge.FAIL { background: var(--nogo); }
.badge.INCONCLUSIVE, .badge.failed { background: var(--warn); }
.muted { color: var(--muted); }
.dataframe { font-size: 0.86em; }
.output_html { overflow-x: auto; }
"""


# --------------------------------------------------------------------------- JSON helpers


def _jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars → Python, NaN/inf → None, paths → str."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy / torch scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "to_dicts"):  # a polars DataFrame: its records
        return _jsonable(value.to_dicts())
    if hasattr(value, "to_json"):
        text = value.to_json()
        return json.loads(text) if isinstance(text, str) else _jsonable(text)
    return str(value)


def write_json(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``data`` as indented JSON atomically (NaN becomes null); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps(_jsonable(data), indent=2, sort_keys=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def save_numbers(numbers: Mapping[str, Any], path: str | Path | None) -> dict[str, Any]:
    """Write a notebook's key numbers to ``path`` (skipped when None); return them.

    The batch runner and the tests read this file to check what a notebook showed against
    the package functions; ``python`` records the interpreter the kernel ran on.
    """
    import sys

    out = {"python": sys.executable, **_jsonable(dict(numbers))}
    if path:
        write_json(out, path)
    return out


# --------------------------------------------------------------------------- HTML


def _page(title: str, body: str, nav: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # An empty data: icon keeps the browser from asking for /favicon.ico.
        '<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"{nav}<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def export_html(
    ipynb: str | Path,
    out: str | Path,
    *,
    title: str | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> Path:
    """Export an executed notebook to a self-contained HTML page with code cells hidden.

    Uses nbconvert's ``basic`` template (cells only, figures inline as PNG) with
    ``exclude_input=True`` and wraps it in a page with inline CSS; no scripts, no CDN.

    Args:
        ipynb: executed notebook.
        out: HTML file to write.
        title: page title (default: the notebook's file stem).
        links: ``(label, href)`` pairs for the navigation bar.

    Returns:
        ``out`` as a Path.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    exporter = HTMLExporter(
        template_name="basic",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(nb)
    out = Path(out)
    nav_links = [("index", "../index.html"), *links]
    nav = (
        "<nav>"
        + "".join(
            f'<a href="{html.escape(href)}">{html.escape(label)}</a>' for label, href in nav_links
        )
        + "</nav>\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_page(title or Path(ipynb).stem, body, nav))
    return out


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.3e}"
    return html.escape(str(value))


def _setting(chosen: Mapping[str, Any] | None) -> str:
    if not chosen:
        return "–"
    return ", ".join(f"{k} = {_fmt(v)}" for k, v in chosen.items())


def write_index(report_dir: str | Path, summaries: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``index.html`` over the tasks of a batch (one row per task × rule family).

    Args:
        report_dir: ``reports/<batch>/``; task reports are in its sub-folders.
        summaries: the tasks' ``summary.json`` dicts.

    Returns:
        Path of the written ``index.html``.
    """
    report_dir = Path(report_dir)
    batch = summaries[0].get("batch", report_dir.name) if summaries else report_dir.name
    rows = []
    for s in summaries:
        task = s["task_slug"]
        links = " · ".join(
            f'<a href="{html.escape(task)}/{html.escape(nb["html"])}">'
            f"{html.escape(nb['name'].replace('_', ' '))}</a>"
            + ("" if nb["ok"] else ' <span class="badge failed">error</span>')
            for nb in s.get("notebooks", [])
            if nb.get("html")
        )
        links += f' · <a href="{html.escape(task)}/summary.json">summary.json</a>'
        families = s.get("families") or [{}]
        for i, fam in enumerate(families):
            verdict = fam.get("verdict") or ("failed" if s.get("status") != "ok" else "–")
            conf = fam.get("confirmation") or {}
            cells = [
                f'<td rowspan="{len(families)}"><b>{html.escape(s["task"])}</b><br>'
                f'<span class="muted">{html.escape(s.get("status", "?"))}</span></td>'
                if i == 0
                else "",
                f"<td>{html.escape(fam.get('rule', '–'))} vs "
                f"{html.escape(fam.get('reference', '–'))}</td>",
                f'<td><span class="badge {html.escape(str(verdict))}">'
                f"{html.escape(str(verdict))}</span></td>",
                f"<td>{html.escape(fam.get('setting') or '–')}"
                + (
                    f'<br><span class="muted">shown: {html.escape(fam["shown_setting"])}</span>'
                    if not fam.get("setting") and fam.get("shown_setting")
                    else ""
                )
                + "</td>",
                f'<td class="num">{_speed(conf) if conf else "–"}</td>',
                f'<td class="num">{_points(conf) if conf else "–"}</td>',
                f'<td class="num">{_pct(conf.get("divergence"))}</td>',
                f'<td rowspan="{len(families)}">{links}</td>' if i == 0 else "",
            ]
            rows.append("<tr>" + "".join(cells) + "</tr>")
    errors = [
        f"<li><b>{html.escape(s['task'])}</b>: {html.escape(e)}</li>"
        for s in summaries
        for e in s.get("errors", [])
    ]
    meta = summaries[0].get("manifest", {}) if summaries else {}
    body = (
        f"<h1>Audit batch <code>{html.escape(str(batch))}</code></h1>\n"
        f'<p class="muted">Generated {html.escape(_now())} · relaxspec_audit '
        f"{html.escape(str(meta.get('package_version', '?')))} · git "
        f"{html.escape(str(meta.get('git_commit') or '?')[:12])}</p>\n"
        "<p>One row per relaxed rule audited against its reference on the confirmation "
        "split: the verdict, the chosen setting, the speed-up over the reference rule, the "
        "accuracy delta in points with its confidence interval, and the share of requests "
        "whose output differs from the reference (hash divergence).</p>\n"
        "<table>\n<tr><th>task</th><th>rule</th><th>verdict</th><th>chosen</th>"
        "<th>speed-up</th><th>accuracy Δ [CI]</th><th>divergence</th><th>reports</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>\n"
        + (f"<h2>Errors</h2>\n<ul>{''.join(errors)}</ul>\n" if errors else "")
    )
    out = report_dir / "index.html"
    out.write_text(_page(f"relaxspec_audit · {batch}", body))
    return out


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- run lookup

#: Reference rule of each relaxed rule (SPEC §3): NSD is judged against ``exact`` on the
#: same random stream, ASD against strict ``greedy``. Other rules: ``exact`` when
#: sampling, ``greedy`` at temperature 0.
REFERENCE = {"nucleus": "exact", "asd": "greedy"}
#: The parameter a setting is chosen over, per rule (the frontier's x).
KNOB = {
    "nucleus": "theta",
    "asd": "budget",
    "typical": "epsilon",
    "fuzzy": "threshold",
    "margin": "theta",
    "topk": "top_k",
}
#: Rules that are references or baselines, never audited as relaxed.
LOSSLESS = ("exact", "greedy", "target")
# Config fields two runs must share to be compared request by request (SPEC §4 pairing).
_PAIR_FIELDS = ("task", "split", "seed", "k", "temperature", "top_k", "top_p",
                "max_new_tokens", "target", "draft")  # fmt: skip


def runs_table(runs_dir: str | Path, task: str | None = None) -> Any:
    """One row per run folder under ``runs_dir`` (optionally of one task), from manifests.

    Returns:
        A polars DataFrame with columns ``run_dir, run_id, task, rule, split, knob, value,
        setting, temperature, seed, k, max_new_tokens, n_requests, status, params``
        (``params`` as canonical JSON), sorted by rule, value and split.

    Raises:
        LogError: ``runs_dir`` holds no run folder.
    """
    import polars as pl

    from relaxspec_audit import logs
    from relaxspec_audit.config import task_slug

    rows = []
    for run_dir in logs.find_runs(runs_dir):
        manifest = logs.read_manifest(run_dir)
        cfg = manifest.get("config", {})
        if task is not None and task_slug(str(cfg.get("task"))) != task_slug(task):
            continue
        rule = str(cfg.get("rule"))
        knob = KNOB.get(rule)
        value = cfg.get("params", {}).get(knob) if knob else None
        rows.append(
            {
                "run_dir": str(run_dir),
                "run_id": manifest.get("run_id"),
                "task": task_slug(str(cfg.get("task"))),
                "rule": rule,
                "split": cfg.get("split"),
                "knob": knob,
                "value": float(value) if value is not None else None,
                "setting": setting_label(rule, cfg.get("params", {})),
                "temperature": float(cfg.get("temperature", 0.0)),
                "seed": cfg.get("seed"),
                "k": cfg.get("k"),
                "max_new_tokens": cfg.get("max_new_tokens"),
                "n_requests": manifest.get("n_requests"),
                "status": manifest.get("status"),
                "params": json.dumps(cfg.get("params", {}), sort_keys=True),
                "_pair": json.dumps([cfg.get(f) for f in _PAIR_FIELDS]),
            }
        )
    schema = {
        "run_dir": pl.String, "run_id": pl.String, "task": pl.String, "rule": pl.String,
        "split": pl.String, "knob": pl.String, "value": pl.Float64, "setting": pl.String,
        "temperature": pl.Float64, "seed": pl.Int64, "k": pl.Int64, "max_new_tokens": pl.Int64,
        "n_requests": pl.Int64, "status": pl.String, "params": pl.String, "_pair": pl.String,
    }  # fmt: skip
    df = pl.DataFrame(rows, schema=schema)
    return df.sort(["rule", "value", "split"], nulls_last=True)


def setting_label(rule: str, params: Mapping[str, Any]) -> str:
    """Short label of a rule setting, e.g. ``nucleus θ=0.9`` or ``asd B=8``."""
    symbols = {"theta": "θ", "budget": "B", "gate": "g", "cap": "M"}
    if not params:
        return rule
    parts = [f"{symbols.get(k, k)}={_fmt(v)}" for k, v in sorted(params.items())]
    return f"{rule} " + " ".join(parts)


def reference_rule(rule: str, temperature: float) -> str:
    """The lossless rule a relaxed rule is judged against (SPEC §3)."""
    return REFERENCE.get(rule, "greedy" if temperature == 0 else "exact")


def _match(table: Any, row: Mapping[str, Any], rule: str) -> str | None:
    """Run folder of ``rule`` that pairs with ``row`` (same task items, seed, sampling)."""
    import polars as pl

    hit = table.filter((pl.col("rule") == rule) & (pl.col("_pair") == row["_pair"]))
    return hit["run_dir"][0] if hit.height else None


def _baseline(table: Any, row: Mapping[str, Any]) -> str | None:
    """Target-only run of the same split and length (temperature does not matter for speed)."""
    import polars as pl

    hit = table.filter(
        (pl.col("rule") == "target")
        & (pl.col("split").eq_missing(row["split"]))
        & (pl.col("max_new_tokens") == row["max_new_tokens"])
    )
    return hit["run_dir"][0] if hit.height else None


# --------------------------------------------------------------------------- audits


def audit_table(
    runs_dir: str | Path,
    task: str,
    *,
    margin: float = 0.02,
    alpha: float = 0.05,
    split: str | None = None,
) -> Any:
    """Every relaxed run of a task audited against its reference: the frontier's data.

    One ``stats.audit_summary`` per relaxed run (with its paired reference and the
    target-only baseline when present), flattened to one row; plus one row per reference
    run itself (``setting`` = the reference rule, delta 0) so the frontier shows it.

    Args:
        runs_dir: folder of run folders.
        task: task name.
        margin: non-inferiority margin δ on the score scale.
        alpha: 1 − confidence level.
        split: only this split (None: every split).

    Returns:
        A polars DataFrame, one row per (rule, setting, split), with columns ``rule,
        reference, knob, value, setting, split, is_reference, n_requests, tau,
        speedup_vs_reference, speedup_ci_low, speedup_ci_high, speedup_vs_baseline,
        accuracy_delta, delta_ci_low, delta_ci_high, p_noninferiority, noninferior,
        score, divergence, divergence_ci_low, divergence_ci_high, first_pos_median,
        eps_mean, bound, identical_rate, identical_ci_low, identical_ci_high, run_dir,
        reference_dir``.
    """
    import polars as pl

    from relaxspec_audit import stats

    table = runs_table(runs_dir, task)
    if split is not None:
        table = table.filter(pl.col("split") == split)
    rows = []
    ref_cache: dict[str, dict[str, Any]] = {}
    for row in table.iter_rows(named=True):
        rule = row["rule"]
        if rule == "target":
            continue
        is_ref = rule in LOSSLESS
        ref_rule = rule if is_ref else reference_rule(rule, row["temperature"])
        ref_dir = None if is_ref else _match(table, row, ref_rule)
        base_dir = _baseline(table, row)
        summary = stats.audit_summary(
            [row["run_dir"]], reference=[ref_dir] if ref_dir else None,
            baseline=[base_dir] if base_dir else None, margin=margin, alpha=alpha,
        )  # fmt: skip
        acc = summary.get("accuracy_delta") or {}
        hd = summary.get("hash_divergence") or {}
        sp = summary.get("speedup_vs_reference") or {}
        # The (1 − ε)^T coupling bound is NSD's (SPEC §2.3): E_S is its deviation per step.
        dev = (summary.get("deviation") or {}) if rule == "nucleus" else {}
        ref_summary = None
        if ref_dir is not None:
            if ref_dir not in ref_cache:
                ref_cache[ref_dir] = stats.audit_summary([ref_dir], margin=margin, alpha=alpha)
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
                "speedup_vs_baseline": (summary.get("speedup_vs_baseline") or {}).get("speedup"),
                "accuracy_delta": 0.0 if is_ref and score is not None else acc.get("delta"),
                "delta_ci_low": acc.get("ci_low"),
                "delta_ci_high": acc.get("ci_high"),
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
    schema = {
        "rule": pl.String, "reference": pl.String, "knob": pl.String, "value": pl.Float64,
        "setting": pl.String, "split": pl.String, "is_reference": pl.Boolean,
        "n_requests": pl.Int64, "tau": pl.Float64, "tau_reference": pl.Float64,
        "speedup_vs_reference": pl.Float64, "speedup_ci_low": pl.Float64,
        "speedup_ci_high": pl.Float64, "speedup_vs_baseline": pl.Float64,
        "accuracy_delta": pl.Float64, "delta_ci_low": pl.Float64, "delta_ci_high": pl.Float64,
        "p_noninferiority": pl.Float64, "noninferior": pl.Boolean, "score": pl.Float64,
        "divergence": pl.Float64, "divergence_ci_low": pl.Float64,
        "divergence_ci_high": pl.Float64, "first_pos_median": pl.Float64,
        "eps_mean": pl.Float64, "bound": pl.Float64, "identical_rate": pl.Float64,
        "identical_ci_low": pl.Float64, "identical_ci_high": pl.Float64,
        "params": pl.String, "run_dir": pl.String, "reference_dir": pl.String,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema).sort(
        ["reference", "is_reference", "rule", "value", "split"],
        descending=[False, True, False, False, False], nulls_last=True,
    )  # fmt: skip


def _mean_score(run_dir: str) -> float | None:
    import polars as pl

    from relaxspec_audit import logs

    req = logs.scan([run_dir], "requests").select(pl.col("score").mean()).collect()
    value = req["score"][0]
    return float(value) if value is not None else None


def manifest_facts(runs_dir: str | Path, task: str) -> dict[str, Any]:
    """What a sign-off must state about how the runs were made (from their manifests).

    Returns:
        ``{"models": {...}, "seeds": [...], "k": [...], "temperatures": [...],
        "package_version", "git_commit", "versions": {...}, "hosts": [...],
        "n_runs", "started_at", "ended_at", "statuses": {...}}``; values that differ
        between runs are listed, not hidden.
    """
    from relaxspec_audit import logs

    table = runs_table(runs_dir, task)
    manifests = [logs.read_manifest(d) for d in table["run_dir"].to_list()]

    def distinct(values: Any) -> list[Any]:
        out = []
        for v in values:
            if v not in out:
                out.append(v)
        return out

    models = distinct(
        json.dumps(m.get("models", {}), sort_keys=True, default=str) for m in manifests
    )
    statuses: dict[str, int] = {}
    for m in manifests:
        statuses[str(m.get("status"))] = statuses.get(str(m.get("status")), 0) + 1
    commits = distinct(m.get("git_commit") for m in manifests)
    versions = distinct(json.dumps(m.get("versions", {}), sort_keys=True) for m in manifests)
    return _jsonable(
        {
            "n_runs": len(manifests),
            "models": [json.loads(x) for x in models],
            "seeds": distinct(m.get("config", {}).get("seed") for m in manifests),
            "k": distinct(m.get("config", {}).get("k") for m in manifests),
            "temperatures": distinct(m.get("config", {}).get("temperature") for m in manifests),
            "max_new_tokens": distinct(
                m.get("config", {}).get("max_new_tokens") for m in manifests
            ),
            "package_version": ", ".join(
                str(v) for v in distinct(m.get("package_version") for m in manifests)
            ),
            "git_commit": commits[0] if len(commits) == 1 else commits,
            "versions": [json.loads(x) for x in versions],
            "hosts": distinct(m.get("host") for m in manifests),
            "started_at": min((m.get("started_at") or "" for m in manifests), default=None),
            "ended_at": max((m.get("ended_at") or "" for m in manifests), default=None),
            "statuses": statuses,
        }
    )


# --------------------------------------------------------------------------- parameters

_SPLITS = ("discovery", "confirmation")


def validate_parameters(**params: Any) -> None:
    """Check a notebook's parameters; raise naming the first bad one.

    Known names: ``runs_dir`` (an existing folder with runs of ``task``), ``task``,
    ``margin`` (≥ 0, score units), ``alpha`` (in (0, 1)), ``thetas`` (non-empty, each in
    (0, 1]), ``split`` / ``discovery`` / ``confirmation`` (a split name),
    ``numbers_path`` (str), ``collect`` (bool), ``limit`` / ``k`` / ``max_new_tokens``
    (int ≥ 1), ``seed`` (int ≥ 0). Unknown names are an error too.

    Raises:
        ValueError: ``"<name>: <what is wrong>, got <value>"``.
    """

    def bad(name: str, what: str) -> None:
        raise ValueError(f"{name}: {what}, got {params[name]!r}")

    for name, value in params.items():
        if name == "runs_dir":
            if not isinstance(value, str | Path) or not value:
                bad(name, "must be a folder")
            if params.get("collect") is not True and not Path(value).is_dir():
                bad(name, "must be an existing folder of run folders")
        elif name == "task":
            if not isinstance(value, str) or not value:
                bad(name, "must be a task name")
        elif name == "rule":
            if value not in (*REFERENCE, *KNOB, *LOSSLESS):
                bad(name, "must be a rule name")
        elif name == "margin":
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                bad(name, "must be a number >= 0 (score units: 0.02 = 2 points)")
        elif name == "alpha":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                bad(name, "must be in (0, 1)")
        elif name == "thetas":
            if not isinstance(value, list | tuple) or not value:
                bad(name, "must be a non-empty list")
            for t in value:
                if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 1:
                    bad(name, f"every θ must be in (0, 1] ({t!r} is not)")
        elif name in ("split", "discovery", "confirmation"):
            if value not in _SPLITS:
                bad(name, f"must be one of {_SPLITS}")
        elif name == "numbers_path":
            if not isinstance(value, str | Path):
                bad(name, "must be a path or ''")
        elif name == "collect":
            if not isinstance(value, bool):
                bad(name, "must be True or False")
        elif name in ("limit", "k", "max_new_tokens", "seed"):
            low = 0 if name == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                bad(name, f"must be an integer >= {low}")
        elif name == "splits":
            if not isinstance(value, list | tuple) or not value or set(value) - set(_SPLITS):
                bad(name, f"must be a non-empty list of {_SPLITS}")
        elif name == "rules":
            if not isinstance(value, list) or not value:
                bad(name, "must be a non-empty list of rule entries")
        else:
            raise ValueError(f"{name}: unknown notebook parameter")
    if "runs_dir" in params and "task" in params and params.get("collect") is not True:
        from relaxspec_audit import logs

        try:
            n = runs_table(params["runs_dir"], params["task"]).height
        except logs.LogError as exc:
            raise ValueError(f"runs_dir: {exc}") from exc
        if n == 0:
            raise ValueError(
                f"task: no runs of task {params['task']!r} under runs_dir {params['runs_dir']!r}"
            )


def run_dirs(
    runs_dir: str | Path,
    task: str,
    *,
    rule: str | None = None,
    split: str | None = None,
    speculative: bool = False,
) -> list[str]:
    """Run folders of a task, optionally of one rule, one split, or only speculative runs.

    Args:
        runs_dir: folder of run folders.
        task: task name.
        rule: keep only this rule.
        split: keep only this split.
        speculative: drop target-only runs (they verify no drafts).
    """
    import polars as pl

    table = runs_table(runs_dir, task)
    if rule is not None:
        table = table.filter(pl.col("rule") == rule)
    if split is not None:
        table = table.filter(pl.col("split") == split)
    if speculative:
        table = table.filter(pl.col("rule") != "target")
    return table["run_dir"].to_list()


def label_runs(frame: Any, runs_dir: str | Path, task: str, on: str = "run") -> Any:
    """Add ``setting``, ``split``, ``value`` (and ``rule``) of each run to a frame keyed by run.

    ``logs.scan`` adds the run id as ``run``, so a scanned table (lazy or not) can be
    labelled before a statistic groups ``by=["setting"]``.
    """
    import polars as pl

    names = frame.collect_schema().names() if isinstance(frame, pl.LazyFrame) else frame.columns
    keep = ["run_id", *(c for c in ("setting", "split", "value", "rule") if c not in names)]
    table = runs_table(runs_dir, task).select(keep).rename({"run_id": on})
    return frame.join(table.lazy() if isinstance(frame, pl.LazyFrame) else table, on=on, how="left")


def runs_overview(runs_dir: str | Path, task: str) -> Any:
    """Runs of a task with their speed (``stats.speed`` per run): what ``collect`` shows."""
    import polars as pl

    from relaxspec_audit import logs, stats

    table = runs_table(runs_dir, task)
    dirs = table["run_dir"].to_list()
    spd = stats.speed(logs.scan(dirs, "rounds"), logs.scan(dirs, "requests"), by=["run"])
    spd = spd.select("run", "tau_mean", "alpha", "tokens_per_s", "passes_per_token")
    out = table.join(spd.rename({"run": "run_id"}), on="run_id", how="left")
    return out.select(
        "rule", "setting", "split", "temperature", "k", "n_requests", "status",
        "tau_mean", "alpha", "tokens_per_s", "passes_per_token", "run_id",
    ).sort(["rule", "setting", "split"]).with_columns(pl.col("tau_mean").round(3))  # fmt: skip


def first_divergences(runs_dir: str | Path, task: str, *, split: str | None = None) -> Any:
    """``stats.first_divergence`` of every relaxed run against its reference, labelled.

    Returns:
        Columns of ``stats.first_divergence`` plus ``rule``, ``setting``, ``split``.
    """
    import polars as pl

    from relaxspec_audit import logs, stats

    table = runs_table(runs_dir, task)
    if split is not None:
        table = table.filter(pl.col("split") == split)
    frames = []
    for row in table.iter_rows(named=True):
        if row["rule"] in LOSSLESS:
            continue
        ref = _match(table, row, reference_rule(row["rule"], row["temperature"]))
        if ref is None:
            continue
        fd = stats.first_divergence(
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


# --------------------------------------------------------------------------- choice and verdict


def recommend(
    runs_dir: str | Path,
    task: str,
    *,
    margin: float = 0.02,
    alpha: float = 0.05,
    discovery: str = "discovery",
    confirmation: str = "confirmation",
    min_items: int = 30,
    table: Any = None,
) -> list[dict[str, Any]]:
    """Choose a setting per relaxed rule on ``discovery``, judge it on ``confirmation``.

    The choice and the verdict are ``select.recommend``'s (SPEC §3 "Choosing θ or a
    budget": the fastest setting non-inferior at ``margin`` on discovery, re-tested on
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
        margin: non-inferiority margin δ (score units).
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

    from relaxspec_audit import logs
    from relaxspec_audit import select as select_mod

    if table is None:
        table = audit_table(runs_dir, task, margin=margin, alpha=alpha)
    out = []
    relaxed = table.filter(~pl.col("is_reference"))
    for rule in relaxed["rule"].unique(maintain_order=True).to_list():
        fam = relaxed.filter(pl.col("rule") == rule)
        knob = fam["knob"][0]
        cols = list(select_mod.SETTING_PARAMS.get(rule, (knob,)))
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
            # Parameters left at their defaults are null in every run: not a setting axis.
            cols = [c for c in cols if c in settings.columns and settings[c].is_not_null().any()]
            cols = cols or [knob]
            requests = logs.scan(rel_dirs, "requests").collect().join(settings, on="run")
            reference = logs.scan(ref_dirs, "requests").collect()
            try:
                verdict = select_mod.recommend(
                    requests, reference, cols, margin=margin, alpha=alpha,
                    min_items=min_items, discovery=discovery, confirmation=confirmation,
                )  # fmt: skip
                reasons = list(verdict.reasons)
            except ValueError as exc:
                reasons = [f"no verdict: {exc}"]
        chosen = verdict.setting if verdict is not None else None
        rows = {split: _setting_row(fam, split, chosen) for split in (discovery, confirmation)}
        shown = (rows[discovery] or {}).get("setting")
        if chosen is None:
            # Nothing chosen: show the fastest setting's numbers, labelled as not chosen
            # (by τ, a function of the logs, as select._fastest ranks; then wall clock).
            fastest = fam.filter(pl.col("split") == discovery).sort(
                ["tau", "speedup_vs_reference", "setting"],
                descending=[True, True, False],
                nulls_last=True,
            )
            if fastest.height:
                label = fastest["setting"][0]
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
    margin: float = 0.02,
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
        margin: non-inferiority margin δ (score units).
        alpha: 1 − confidence level.
        batch: batch name (None outside a batch).
        run_dirs: the runs the batch collected for this task (recorded, not required).
        errors: collection errors to record; any error makes ``status`` ``failed``.
        notebooks: ``{name, ok, html, error}`` per rendered notebook.
        parameters: notebook parameters of the task (``margin`` and ``alpha`` are read
            from here when given).
        table: a precomputed :func:`audit_table` of both splits (else computed).

    Returns:
        A JSON-ready dict; statistics that fail are recorded in ``errors``.
    """
    from relaxspec_audit import __version__
    from relaxspec_audit.config import task_slug

    parameters = dict(parameters or {})
    margin = float(parameters.get("margin", margin))
    alpha = float(parameters.get("alpha", alpha))
    errors = list(errors)
    families: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    try:
        families = recommend(runs_dir, task, margin=margin, alpha=alpha, table=table)
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
        "margin": margin,
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


# --------------------------------------------------------------------------- markdown


def _pct(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _points(row: Mapping[str, Any] | None) -> str:
    if not row:
        return "–"
    if row.get("accuracy_delta") is None:
        return "– (no scorer)"
    d, lo, hi = row["accuracy_delta"], row.get("delta_ci_low"), row.get("delta_ci_high")
    ci = f" [{100 * lo:+.1f}, {100 * hi:+.1f}]" if lo is not None and hi is not None else ""
    return f"{100 * d:+.1f} pt{ci}"


def _speed(row: Mapping[str, Any] | None) -> str:
    if not row or row.get("speedup_vs_reference") is None:
        return "–"
    s = f"{row['speedup_vs_reference']:.2f}×"
    if row.get("speedup_ci_low") is not None and row.get("speedup_ci_high") is not None:
        s += f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"
    return s


def choices_markdown(choices: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of :func:`recommend` results: choice, discovery and confirmation numbers."""
    if not choices:
        return "_No relaxed rule among the runs: nothing to choose._"
    lines = [
        "| rule | verdict | chosen | split | speed-up vs ref. [CI] | accuracy Δ [CI] "
        "| non-inferior | divergence |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in choices:
        for split in ("discovery", "confirmation"):
            row = c.get(split)
            lines.append(
                f"| {c['rule']} vs {c['reference']} | **{c['verdict']}** "
                f"| {c.get('setting') or '–'} "
                f"| {split} | {_speed(row)} | {_points(row)} "
                f"| {'–' if not row else row.get('noninferior')} "
                f"| {_pct(row.get('divergence')) if row else '–'} |"
            )
    notes = [f"- {c['rule']}: {r}" for c in choices for r in [*c["reasons"], *c["caveats"]]]
    return "\n".join(lines + (["", *notes] if notes else []))


def signoff_markdown(summary: Mapping[str, Any]) -> str:
    """The one-page sign-off text of a task summary: verdicts, numbers, caveats."""
    out = [
        f"# Sign-off: `{summary['task']}`",
        "",
        "The record for deploying a relaxed rule on this task: per rule, the verdict, the "
        "setting chosen on the discovery split and what it measured on the confirmation split "
        "against its lossless reference, the caveats, and how the runs were made. "
        "`summary.json` beside this page holds the same numbers.",
        "",
        f"Non-inferiority margin δ = {100 * summary['margin']:g} points, "
        f"{100 * (1 - summary['alpha']):g}% intervals. Status: **{summary['status']}**.",
    ]
    if not summary.get("families"):
        out += ["", "_No relaxed rule was audited for this task._"]
    for fam in summary.get("families", []):
        conf = fam.get("confirmation")
        out += [
            "",
            f"## {fam['rule']} vs {fam['reference']}: **{fam['verdict'].upper()}**",
            "",
            f"- chosen {fam['knob']}: **{fam.get('setting') or 'none'}** (on the discovery split)",
        ]
        if not fam.get("setting") and fam.get("shown_setting"):
            out.append(f"- numbers below: the fastest setting, {fam['shown_setting']} (not chosen)")
        if fam.get("n_required"):
            out.append(f"- items per split needed for a powered decision: {fam['n_required']}")
        out.append(f"- speed-up over {fam['reference']} (confirmation): {_speed(conf)}")
        if conf and conf.get("speedup_vs_baseline") is not None:
            out.append(f"- speed-up over target-only decoding: {conf['speedup_vs_baseline']:.2f}×")
        if conf and conf.get("tau") is not None:
            out.append(
                f"- tokens per target pass τ: {conf['tau']:.2f} "
                f"(reference {conf.get('tau_reference') or float('nan'):.2f})"
            )
        out += [
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
            out.append(f"- why: {r}")
        for c in fam.get("caveats", []):
            out.append(f"- caveat: {c}")
    for e in summary.get("errors", []):
        out.append(f"- **error**: {e}")
    return "\n".join(out)


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
                desc = ", ".join(f"{k}: {v}" for k, v in info.items() if not isinstance(v, dict))
            else:
                desc = str(info)
            lines.append(f"| {role} model{f' ({i + 1})' if i else ''} | {desc} |")
    for key in ("seeds", "k", "temperatures", "max_new_tokens", "package_version",
                "git_commit", "hosts", "n_runs", "statuses", "started_at", "ended_at"):  # fmt: skip
        lines.append(f"| {key.replace('_', ' ')} | {facts.get(key)} |")
    for v in facts.get("versions", []):
        lines.append(f"| versions | {', '.join(f'{k} {x}' for k, x in v.items())} |")
    return "\n".join(lines)
