"""The divergence explorer: which outputs a relaxed rule changed, where first, and why.

Renders :class:`~relaxspec_audit.audit.divergences.Divergences` (computed by
:func:`relaxspec_audit.audit.divergences.divergences` from the logs): one static page per
task and relaxed rule (:func:`divergence_page`), one section per setting, each diverged
request's two outputs side by side with the first divergent token marked and every token
coloured by what emitted it. The colours follow the two tests each draft row logs (THEORY
§2): accepted by the reference's ratio test ``u < min(1, p/q)`` (``accepted ∧
passed_ratio``), accepted only by the relaxation (``accepted ∧ ¬passed_ratio``: the rows
that can make a relaxed output differ, THEORY §2.3), a recovery sample, or the bonus token.
:func:`request_view` renders one pair the same way for a notebook.

Pages stay static and script-free like the other reports (:mod:`.export`): per-token
details live in ``title`` attributes, every value from a log, manifest or tokenizer is
escaped with ``html.escape``, and a page body passes :func:`~.export._no_scripts`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaxspec_audit.report.export import _no_scripts, _page

if TYPE_CHECKING:  # the data's types only: rendering needs no polars
    from relaxspec_audit.audit.divergences import Divergences, Output, Pair, SettingDivergences

__all__ = ["CAUSE_CLASSES", "divergence_page", "request_view"]

#: Token class per cause of emission, with its legend text (report order).
CAUSE_CLASSES = {
    "tok-ratio": "accepted by the ratio test",
    "tok-relax": "accepted only by the relaxation",
    "tok-recovery": "recovered (sampled after a rejection)",
    "tok-bonus": "bonus (target token after a fully accepted block)",
}
#: Class of the first divergent token, on both sides.
FIRST_CLASS = "tok-first"
_NO_LOG = "tok-nolog"  # a token without a position row (position logging was off)

# Visible whitespace: a space or newline token would otherwise be an invisible coloured box.
_VISIBLE = str.maketrans({" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"})

_DETAIL_COLS = ("p", "q", "rank", "mass_above", "entropy_p", "entropy_q", "logp_target")
# Label and unit of each detail (entropies in nats: verify/diagnostics.py uses log base e).
_DETAIL_LABELS = {"p": ("p", ""), "q": ("q", ""), "rank": ("rank", ""),
                  "mass_above": ("mass above", ""), "entropy_p": ("H(p)", " nats"),
                  "entropy_q": ("H(q)", " nats"),
                  "logp_target": ("log p_target", " nats")}  # fmt: skip

# Token boxes wrap anywhere (a long token never widens the page); the two outputs sit in
# two columns that collapse to two rows on narrow screens, so nothing overflows 1280 px.
_CSS = """
.xp-legend span.tok { margin-right: 4px; }
.xp-req { border: 1px solid var(--line, #d1d9e0); border-radius: 6px; padding: 8px 12px;
          margin: 12px 0; }
.xp-req h3 { margin: 0 0 4px; font-size: 1.02em; }
.xp-pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px; }
@media (max-width: 760px) { .xp-pair { grid-template-columns: minmax(0, 1fr); } }
.xp-side { min-width: 0; }
.xp-side h4 { margin: 4px 0; font-size: 0.9em; font-weight: 600; }
.xp-tokens { font: 0.86em/1.9 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
             overflow-wrap: anywhere; }
span.tok { white-space: pre-wrap; padding: 1px 1px; margin: 0 1px 0 0; border-radius: 3px;
           border-bottom: 2px solid transparent; }
span.tok-ratio { background: #dafbe1; }
span.tok-relax { background: #ffd8b5; border-bottom: 2px dashed #bc4c00; }
span.tok-recovery { background: #ddf4ff; }
span.tok-bonus { background: #fbefff; }
span.tok-nolog { background: #eaeef2; }
span.tok-first { outline: 2px solid #cf222e; outline-offset: 1px; }
span.tok-first::before { content: "▸"; color: #cf222e; }
.xp-end { color: #cf222e; font-size: 0.85em; }
"""


#: Tokens drawn each side of a request's first divergence (the rest is summarised).
WINDOW = 64


def _visible(text: str | None, token_id: int) -> str:
    """A token's text with whitespace made visible; ``#<id>`` without a tokenizer."""
    if text is None:
        return f"#{token_id}"
    return text.translate(_VISIBLE) or f"#{token_id}"


# ----------------------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------------------


def _cause_class(row: Mapping[str, Any] | None) -> str:
    """The token class of an emitting row (the four causes of the module docstring)."""
    if row is None:
        return _NO_LOG
    if row["kind"] == "recovery":
        return "tok-recovery"
    if row["kind"] == "bonus":
        return "tok-bonus"
    return "tok-ratio" if row.get("passed_ratio") else "tok-relax"


def _num(value: Any) -> str:
    return "–" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _detail(col: str, value: Any) -> str:
    label, unit = _DETAIL_LABELS[col]
    return f"{label} = {_num(value)}{unit if value is not None else ''}"


def _title(t: int, token_id: int, row: Mapping[str, Any] | None) -> str:
    """A token's details, one per line, for its ``title`` attribute (unescaped)."""
    head = f"t={t} · token id {token_id}"
    if row is None:
        return f"{head}\nno position row (logged without positions)"
    lines = [
        head,
        f"{row['kind']}, round {row['round']} pos {row['pos']}: "
        f"{CAUSE_CLASSES[_cause_class(row)]} (cause {row['cause']})",
        " · ".join(_detail(c, row[c]) for c in _DETAIL_COLS if c in row),
    ]
    return "\n".join(lines)


def _tokens_html(output: Output, first: int | None) -> str:
    """One output as coloured token spans, the first divergent one marked.

    Only a window of :data:`WINDOW` tokens each side of the first divergence is drawn:
    every span carries its details, so whole long outputs would make pages of tens of MB.
    """
    tokens = output.tokens
    centre = first if first is not None else 0
    lo, hi = max(0, centre - WINDOW), min(len(tokens), centre + WINDOW + 1)
    spans = [f'<span class="xp-end">… {lo} tokens before</span>'] if lo else []
    for t in range(lo, hi):
        tok = tokens[t]
        cls = f"tok {_cause_class(tok.row)}" + (f" {FIRST_CLASS}" if t == first else "")
        spans.append(
            f'<span class="{cls}" title="{html.escape(_title(t, tok.id, tok.row))}">'
            f"{html.escape(_visible(tok.text, tok.id))}</span>"
        )
    if hi < len(tokens):
        spans.append(f'<span class="xp-end">… {len(tokens) - hi} tokens after</span>')
    if first is not None and first >= len(tokens):
        spans.append('<span class="xp-end">▸ output ends here</span>')
    # <wbr>: lines break between tokens; overflow-wrap breaks inside only an over-long one.
    return "<wbr>".join(spans)


def _verdict_line(pair: Pair) -> str:
    """Where the outputs first differ, and the attribution of that divergence (escaped)."""
    first = pair.first_pos
    if first is None:
        return "identical outputs"
    why = pair.attribution or "?"
    ended = len(pair.relaxed.tokens) <= first
    cause = pair.cause or ("the relaxed output ended first" if ended else "no position row")
    kind = f", {pair.kind} row" if pair.kind else ""
    return html.escape(f"first divergence at token {first}: {why} ({cause}{kind})")


def _score_line(pair: Pair) -> str:
    """Scores of both sides, or nothing for a task without a scorer."""
    if pair.score_rel is None and pair.score_ref is None:
        return ""
    return (
        f" · score: reference {html.escape(_num(pair.score_ref))}, "
        f"relaxed {html.escape(_num(pair.score_rel))}"
    )


def _request_html(pair: Pair) -> str:
    """One request pair: item id, attribution, scores, and the two outputs side by side."""
    sides = []
    for out in (pair.reference, pair.relaxed):
        sides.append(
            f'<div class="xp-side"><h4>{html.escape(out.label)} <span class="muted">'
            f"({len(out.tokens)} tokens, stop: {html.escape(str(out.stop))})"
            f'</span></h4><div class="xp-tokens">{_tokens_html(out, pair.first_pos)}'
            "</div></div>"
        )
    sample = f" #{pair.sample}" if pair.sample else ""
    return (
        f'<div class="xp-req"><h3>{html.escape(pair.item_id + sample)}</h3>'
        f'<div class="muted">{_verdict_line(pair)}{_score_line(pair)}</div>'
        f'<div class="xp-pair">{"".join(sides)}</div></div>'
    )


def _legend() -> str:
    items = "".join(
        f'<span class="tok {cls}">{html.escape(text)}</span> '
        for cls, text in CAUSE_CLASSES.items()
    )
    return (
        f'<p class="xp-legend">{items}<span class="tok tok-ratio {FIRST_CLASS}">first divergent '
        'token</span></p><p class="muted">Hover a token for its details: p and q of the '
        "token, its rank and the mass ranked above it under p, the entropies of p and q, and "
        "its log-probability under the untransformed target. Tokens after the first "
        "divergence follow different prefixes and are not compared position by position."
        "</p>"
    )


def _section(sec: SettingDivergences) -> str:
    """One setting's section."""
    head = (
        f'<h2>{html.escape(sec.setting)}</h2>\n<p class="muted">run {html.escape(str(sec.run_id))}'
    )
    if sec.reference_run_id is None:
        return (
            head + f"</p><p>No paired {html.escape(sec.reference_rule)} reference run (same "
            "items, seed and sampling): nothing to compare.</p>"
        )
    n_none = sec.n_diverged - sec.n_rule - sec.n_numerics
    unread = (
        f" {n_none} cannot be attributed (the run was collected without position logs)."
        if n_none
        else ""
    )
    body = [
        f" against {html.escape(sec.reference_rule)} run {html.escape(sec.reference_run_id)}"
        f"</p>\n<p>{sec.n_diverged} of {sec.n_pairs} outputs differ from the reference; "
        f"of the first divergences, {sec.n_rule} are at a decision of the relaxed rule and "
        f"{sec.n_numerics} are numerical.{unread}</p>"
    ]
    if sec.n_diverged > len(sec.pairs):
        body.append(
            f'<p class="muted">Showing the {len(sec.pairs)} of {sec.n_diverged} diverged '
            f"requests that diverge earliest; {sec.n_diverged - len(sec.pairs)} more left out.</p>"
        )
    body += [_request_html(pair) for pair in sec.pairs]
    return head + "".join(body)


def _style() -> str:
    # .muted is the report pages' class; a notebook fragment has no page CSS to take it from.
    return f"<style>{_CSS}.xp-root .muted {{ color: #59636e; }}</style>\n"


def _tokenizer_note(why: str | None) -> str:
    if why is None:
        return ""
    return f'<p class="muted">Token text unavailable: {html.escape(why)}; tokens show as #id.</p>\n'


def _intro(task: str, rule: str, split: str | None) -> str:
    return (
        f"<h1>Divergence explorer: {html.escape(rule)} on {html.escape(task)}</h1>\n"
        f'<p class="muted">Split {html.escape(str(split or "none (runs without splits)"))}. '
        "One section per setting. Each diverged request shows the reference run's output "
        "and the relaxed run's, decoded on the same random stream, sorted by where they "
        "first differ. A first divergence is the <b>rule</b>'s when a draft at or before it "
        "was decided against the reference's ratio test, and <b>numerics</b> otherwise (float "
        "differences between the two runs).</p>\n"
    )


def divergence_page(
    view: Divergences,
    out: str | Path,
    *,
    title: str | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the divergence explorer page of one task and relaxed rule (module docstring).

    Args:
        view: the explorer's data (``audit.divergences.divergences``).
        out: HTML file to write.
        title: page title (default: names the rule, task and split).
        links: ``(label, href)`` pairs for the navigation bar (e.g. the index, the sign-off).

    Returns:
        ``out`` as a Path.
    """
    why = next((s.tokenizer_note for s in view.settings if s.tokenizer_note), None)
    sections = [f'<section class="xp-root">{_section(sec)}</section>' for sec in view.settings]
    body = (
        _intro(view.task, view.rule, view.split)
        + _tokenizer_note(why)
        + _legend()
        + "\n".join(sections)
    )
    nav = "".join(f'<a href="{html.escape(h)}">{html.escape(lbl)}</a>' for lbl, h in links)
    title = title or f"Divergence explorer · {view.task} · {view.rule} ({view.split or 'no split'})"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = _page(title, _style() + _no_scripts(body), f"<nav>{nav}</nav>\n" if links else "")
    out.write_text(page)
    return out


def request_view(pair: Pair, tokenizer_note: str | None = None) -> str:
    """One request pair as a self-contained HTML fragment (with its own ``<style>``).

    For a notebook: ``HTML(request_view(*audit.divergences.request_pair(rel, ref, id)))``.
    An undiverged request shows both outputs with no marker.
    """
    body = _tokenizer_note(tokenizer_note) + _legend() + _request_html(pair)
    return _style() + f'<div class="xp-root">{_no_scripts(body)}</div>'
