"""Static HTML: executed notebooks exported with code hidden, and the batch's ``index.html``.

Everything here writes static, self-contained files: HTML with inline CSS, figures as
inline PNG (nbconvert's ``basic`` template), no scripts and no external resources, so a
report opens offline and can be archived with the sign-off.

Values from summaries and manifests are escaped where they are placed (``html.escape``
here, :func:`~.format._md` in the notebooks' markdown). As a last guard, a page never
carries a ``<script>`` element: JavaScript outputs are dropped before the export and any
script tag left in a notebook's HTML output is shown as text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from relaxspec_audit.audit.results import AnatomyBlock, FamilyVerdict, TaskAudit
from relaxspec_audit.report.format import _iv, _now, _pct, _points, accuracy_pair, pct

_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --soft: #f6f8fa;
        --go: #1a7f37; --nogo: #cf222e; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); }
main { max-width: 1180px; margin: 0 auto; padding: 16px 24px 48px; }
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
.badge.NO-GAIN { background: #6e7781; }
.muted { color: var(--muted); }
.dataframe { font-size: 0.86em; }
/* Nothing widens the page past the window: wide tables and outputs scroll in place, and
   long ids (run ids, model paths, hashes) break anywhere instead of pushing the layout. */
.output_html, .output_markdown, .jp-RenderedHTMLCommon, .table-wrap { overflow-x: auto;
  max-width: 100%; }
.table-wrap { margin: 8px 0 16px; } .table-wrap table { margin: 0; }
td, li, p { overflow-wrap: break-word; }
.id { word-break: break-all; }
table.report td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.report caption { text-align: left; color: var(--muted); padding-bottom: 4px; }
.reason { display: block; min-width: 13em; max-width: 24em; font-size: 0.85em;
          color: var(--muted); }
.output_markdown table, .text_cell_render table { display: block; overflow-x: auto;
  max-width: 100%; }
"""


# An opening or closing script tag in any case (``<script``, ``</SCRIPT``): the one element
# a static report page never needs.
_SCRIPT_TAG = re.compile(r"<(/?)(script\b)", re.IGNORECASE)


def _no_scripts(body: str) -> str:
    """``body`` with every script tag turned into text (``&lt;script``), so none runs."""
    return _SCRIPT_TAG.sub(r"&lt;\1\2", body)


def _href(*segments: str) -> str:
    """A relative link from path segments, percent-encoded.

    ``./`` comes first so that a segment such as ``javascript:x`` stays a file name and
    never becomes a URL scheme.
    """
    return html.escape("./" + "/".join(quote(str(s), safe="") for s in segments))


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
    for cell in nb.cells:  # nbconvert renders a JavaScript output as a live <script>
        if "outputs" not in cell:
            continue
        for output in cell.outputs:
            output.get("data", {}).pop("application/javascript", None)
        cell.outputs = [o for o in cell.outputs if o.get("data", True)]  # nothing left to show
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
    out.write_text(_page(title or Path(ipynb).stem, _no_scripts(body), nav))
    return out


#: The θ the index quotes: the NSD paper's 52.6% is at θ = 0.95 (THEORY §3).
INDEX_THETA = 0.95


def anatomy_line(block: AnatomyBlock, theta: float = INDEX_THETA) -> str | None:
    """One line for the index: ``exact rejections inside the θ=0.95 nucleus: 41% [35, 47]``.

    From the confirmation run when the block has one (where a verdict is judged), else
    the first run; None when no run logged a share at ``theta``.
    """
    for run in sorted(block.runs, key=lambda r: r.split != "confirmation"):
        for row in run.in_nucleus:
            if abs(row.theta - theta) < 1e-9:
                where = f" ({run.split})" if run.split else ""
                share = pct(row.fraction, row.ci_low, row.ci_high)
                return f"{block.rule} rejections inside the θ={theta:g} nucleus{where}: {share}"
    return None


def _task_terms(audit: TaskAudit) -> str:
    """The terms a task's verdicts used: margin δ (points) and minimum gain (×)."""
    return f"δ = {100 * audit.ni_margin:g} pt · min gain {audit.min_gain:g}×"


def _n_per_split(fam: FamilyVerdict) -> str:
    """Requests per split of the shown setting, ``discovery / confirmation``."""
    n = [getattr(fam, split) for split in ("discovery", "confirmation")]
    return " / ".join("–" if r is None or r.n_requests is None else str(r.n_requests) for r in n)


def _family_cells(fam: FamilyVerdict, task: str) -> list[str]:
    """The cells of one family's index row (escaped), after the task cell."""
    conf = fam.confirmation
    speed = fam.speed
    wall = speed.wall_clock
    floor_short = getattr(fam.noise_floor, "short", None)
    vs_target = speed.vs_target
    slow = vs_target is not None and (vs_target.ci_high or 2.0) < 1.0
    return [
        f"<td>{html.escape(fam.rule)} vs {html.escape(fam.reference)}"
        + (
            f'<br><a href="{_href(task, fam.divergence_html)}">divergences</a>'
            if fam.divergence_html
            else ""
        )
        + "</td>",
        f'<td><span class="badge {html.escape(fam.verdict)}">{html.escape(fam.verdict)}</span>'
        f'<span class="reason">{html.escape(fam.headline)}</span></td>',
        f'<td class="num">{html.escape(_n_per_split(fam))}</td>',
        f"<td>{html.escape(fam.setting or '–')}"
        + (
            f'<br><span class="muted">shown: {html.escape(fam.shown_setting)}</span>'
            if not fam.setting and fam.shown_setting
            else ""
        )
        + "</td>",
        f'<td class="num">{html.escape(_iv(speed.modelled))}'
        + (
            f'<br><span class="muted" title="{html.escape(wall.label)}">wall clock '
            f"{html.escape(_iv(wall))}<br>({html.escape(wall.kind)})</span>"
            if wall
            else ""
        )
        + "</td>",
        f'<td class="num" title="{html.escape(speed.sentence)}">{html.escape(_iv(vs_target))}'
        + ('<br><span class="muted">speculation does not pay</span>' if slow else "")
        + "</td>",
        f'<td class="num">{_points(conf) if conf else "–"}'
        + (
            f'<br><span class="muted">accuracy {html.escape(accuracy_pair(conf))}</span>'
            if conf and conf.score is not None
            else ""
        )
        + "</td>",
        f'<td class="num">{_pct(conf.divergence if conf else None)}'
        + (
            f'<br><span class="muted">floor {html.escape(floor_short)}</span>'
            if floor_short
            else ""
        )
        + "</td>",
    ]


def write_index(report_dir: str | Path, audits: Sequence[TaskAudit]) -> Path:
    """Write ``index.html`` over the tasks of a batch (one row per task × rule family).

    Args:
        report_dir: ``reports/<batch>/``; task reports are in its sub-folders.
        audits: the tasks' audits (``summary.json``), rendered as they are.

    Returns:
        Path of the written ``index.html``.
    """
    report_dir = Path(report_dir)
    batch = (audits[0].batch or report_dir.name) if audits else report_dir.name
    rows = []
    for s in audits:
        task = s.task_slug
        links = " · ".join(
            f'<a href="{_href(task, nb.html)}">{html.escape(nb.name.replace("_", " "))}</a>'
            + ("" if nb.ok else ' <span class="badge failed">error</span>')
            for nb in s.notebooks
            if nb.html
        )
        links += f' · <a href="{_href(task, "summary.json")}">summary.json</a>'
        anatomy = anatomy_line(s.rejection_anatomy)
        head = (
            f"<b>{html.escape(s.task)}</b><br>"
            f'<span class="muted">{html.escape(s.status)}<br>{html.escape(_task_terms(s))}</span>'
            + (f'<br><span class="muted">{html.escape(anatomy)}</span>' if anatomy else "")
        )
        families = s.families or [None]
        for i, fam in enumerate(families):
            first = f'<td rowspan="{len(families)}">{head}</td>' if i == 0 else ""
            last = f'<td rowspan="{len(families)}">{links}</td>' if i == 0 else ""
            if fam is None:  # a task that audited no family (or failed before it could)
                verdict = "failed" if s.status != "ok" else "–"
                badge = f'<td><span class="badge {verdict}">{verdict}</span></td>'
                cells = ["<td>–</td>", badge, *["<td>–</td>"] * 6]
            else:
                cells = _family_cells(fam, task)
            rows.append("<tr>" + first + "".join(cells) + last + "</tr>")
    errors = [
        f"<li><b>{html.escape(s.task)}</b>: {html.escape(e)}</li>" for s in audits for e in s.errors
    ]
    meta = audits[0].manifest if audits else None
    version = meta.package_version if meta else "?"
    commit = meta.git_commit if meta else None
    commit = commit if isinstance(commit, str) else "?"
    body = (
        f"<h1>Audit batch <code>{html.escape(str(batch))}</code></h1>\n"
        f'<p class="muted">Generated {html.escape(_now())} · relaxspec_audit '
        f"{html.escape(str(version))} · git {html.escape(commit[:12])}</p>\n"
        "<p>One row per relaxed rule audited against its reference on the confirmation "
        "split: the verdict with its deciding reason (PASS needs non-inferiority <em>and</em> "
        "a modelled speed-up "
        "whose lower bound clears the minimum gain; NO-GAIN is non-inferior but not faster), "
        "the number of requests per split (discovery / confirmation), "
        "the chosen setting, the <b>modelled</b> speed-up over the reference rule (pass "
        "counts × the measured cost table: the same logs always give the same number) with "
        "the wall clock below it, labelled by how it was measured; the modelled speed-up "
        "over target-only decoding; the accuracy delta in points with its confidence "
        "interval (absolute accuracy below it); and the share of requests whose output "
        "differs from the reference, with "
        "the noise floor the lossless decoder itself shows.</p>\n"
        "<p>Under each task: the non-inferiority margin δ and the minimum gain the "
        "verdict used.</p>\n"
        '<div class="table-wrap"><table>\n<tr><th>task</th><th>rule</th><th>verdict</th>'
        "<th>N per split</th><th>chosen</th>"
        "<th>speed-up vs reference (modelled) [CI]</th><th>vs target-only</th>"
        "<th>accuracy Δ [CI]</th><th>divergence</th><th>reports</th></tr>\n"
        + "\n".join(rows)
        + "\n</table></div>\n"
        + (f"<h2>Errors</h2>\n<ul>{''.join(errors)}</ul>\n" if errors else "")
    )
    out = report_dir / "index.html"
    out.write_text(_page(f"relaxspec_audit · {batch}", body))
    return out


def signoff_page(
    audit: TaskAudit, out: str | Path, *, links: Sequence[tuple[str, str]] = ()
) -> Path:
    """Write a task's sign-off as a static page, from its audit alone (no logs, no notebook).

    The sign-off notebook's text (:func:`~.markdown.signoff_markdown`) and the manifest
    facts, rendered to HTML; so a ``summary.json`` read back (:meth:`TaskAudit.read`) is
    enough to show what was signed off. Every value is escaped by the markdown helpers.
    """
    import mistune

    from relaxspec_audit.report.markdown import manifest_markdown, signoff_markdown

    render = mistune.create_markdown(escape=False, plugins=["table"])
    text = signoff_markdown(audit) + "\n\n## How the runs were made\n\n"
    text += manifest_markdown(audit.manifest)
    nav = "".join(f'<a href="{html.escape(h)}">{html.escape(lbl)}</a>' for lbl, h in links)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = _page(f"Sign-off · {audit.task}", _no_scripts(render(text)),
                 f"<nav>{nav}</nav>\n" if links else "")  # fmt: skip
    out.write_text(page)
    return out
