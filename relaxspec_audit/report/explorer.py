"""The divergence explorer: which outputs a relaxed rule changed, where first, and why.

One static page per task and relaxed rule (:func:`divergence_page`), one section per
setting: each request whose output differs from its paired reference run's (THEORY §4
pairing: same items, seed and sampling, so both see one random stream until a decision
differs), the two outputs side by side with the first divergent token marked and every
token coloured by what emitted it. The colours follow the two tests each draft row logs
(THEORY §2): accepted by the reference's ratio test ``u < min(1, p/q)``
(``accepted ∧ passed_ratio``), accepted only by the relaxation (``accepted ∧
¬passed_ratio``: the rows that can make a relaxed output differ, THEORY §2.3), a recovery
sample, or the bonus token. Each first divergence is attributed to the rule or to numerics
by :func:`~relaxspec_audit.audit.attribution.attribute_divergence` (THEORY §3 "Noise
floor"). :func:`request_view` renders one request the same way for a notebook.

Pages stay static and script-free like the other reports (:mod:`.export`): per-token
details live in ``title`` attributes, every value from a log, manifest or tokenizer is
escaped with ``html.escape``, and a page body passes :func:`~.export._no_scripts`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from relaxspec_audit.report.export import _no_scripts, _page

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
_ROW_COLS = ("request_id", "abs_pos", "round", "pos", "kind", "accepted", "passed_ratio",
             "cause", *_DETAIL_COLS)  # fmt: skip
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


# ----------------------------------------------------------------------------------------
# Token text
# ----------------------------------------------------------------------------------------


def _tokenizer_path(manifest: Mapping[str, Any]) -> str | None:
    """Where the run's target tokenizer was loaded from (its manifest's models, else config)."""
    models = manifest.get("models") or {}
    for where in ((models.get("tokenizer") or {}).get("name_or_path"),
                  (models.get("target") or {}).get("path"),
                  (manifest.get("config") or {}).get("target")):  # fmt: skip
        if where:
            return str(where)
    return None


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> tuple[Any, str | None]:
    """``(tokenizer, None)``, or ``(None, why)`` when it cannot be loaded from local files.

    A local folder goes through the collector's loader (it keeps a saved generic tokenizer
    as saved); a hub id is read from the local cache only: a report never touches the
    network.
    """
    try:
        if Path(path).expanduser().is_dir():
            from relaxspec_audit.collect.pair import load_tokenizer

            return load_tokenizer(path), None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True), None
    except Exception as exc:  # any failure only costs the token text: say why, go on
        return None, f"{type(exc).__name__}: {exc}"


def _token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token id decoded alone, whitespace made visible; ``#<id>`` without a tokenizer."""
    if tokenizer is None:
        return [f"#{i}" for i in ids]
    return [tokenizer.decode([int(i)]).translate(_VISIBLE) or f"#{i}" for i in ids]


# ----------------------------------------------------------------------------------------
# Logs
# ----------------------------------------------------------------------------------------


def _pairs(rel_dir: str, ref_dir: str, rule: str) -> Any:
    """Every request pair of two runs with where its outputs first differ and why.

    Pairing and first positions are :func:`~relaxspec_audit.audit.fidelity.first_divergence`'s;
    ``attribution``/``cause``/``kind`` of each diverged pair are
    :func:`~relaxspec_audit.audit.attribution.attribute_divergence`'s (null when identical).
    Sorted by first divergent position (identical pairs last), then item.
    """
    import polars as pl

    from relaxspec_audit.audit.attribution import attribute_divergence
    from relaxspec_audit.audit.fidelity import first_divergence
    from relaxspec_audit.collect import logs

    rel_req = logs.scan([rel_dir], "requests").collect()
    ref_req = logs.scan([ref_dir], "requests").collect()
    keep = ["request_id", "output_ids", "score", "stop"]
    pairs = first_divergence(rel_req, ref_req, by=[], keep=keep)
    # typical and fuzzy resample from their own residual: their recoveries are the rule's
    # (the same choice as report.noise.attribution_facts).
    att = attribute_divergence(logs.scan([rel_dir], "positions"), rel_req, ref_req, by=[],
                               rule_recovery=rule in ("typical", "fuzzy"))  # fmt: skip
    att = att.select(pl.col("request_id").alias("request_id_rel"), "attribution", "cause", "kind")
    pairs = pairs.join(att, on="request_id_rel", how="left")
    if logs.read_manifest(rel_dir).get("config", {}).get("log_positions") is False:
        # Without position rows no decision can be read: never call such a divergence
        # "numerics" (attribute_divergence finds no departure there).
        diverged = pl.col("first_pos").is_not_null()
        pairs = pairs.with_columns(
            pl.when(diverged).then(pl.lit(UNATTRIBUTED)).otherwise(None).alias("attribution"),
            pl.lit(None, pl.String).alias("cause"),
            pl.lit(None, pl.String).alias("kind"),
        )
    return pairs.sort(["first_pos", "item_id", "sample"], nulls_last=True)


#: Tokens drawn each side of a request's first divergence (the rest is summarised).
WINDOW = 64
#: Attribution of a divergence in a run logged without positions (no decision to read).
UNATTRIBUTED = "unattributed"


def _emitted(run_dir: str, request_ids: Sequence[str]) -> dict[str, dict[int, dict]]:
    """Per request, output index → the position row that emitted that token.

    Emitted rows are :func:`~relaxspec_audit.audit.likelihood.emitted_rows`'s (one per
    output token), and their ``abs_pos`` is the output index. Columns a log lacks
    (``logp_target`` in old logs) are left out; a run without position logs gives {}.
    """
    import polars as pl

    from relaxspec_audit.audit.likelihood import emitted_rows
    from relaxspec_audit.collect import logs

    lf = logs.scan([run_dir], "positions")
    cols = [c for c in _ROW_COLS if c in lf.collect_schema().names()]
    rows = (
        emitted_rows(lf.filter(pl.col("request_id").is_in(list(request_ids))))
        .select(cols)
        .collect()
    )
    out: dict[str, dict[int, dict]] = {}
    for row in rows.iter_rows(named=True):
        out.setdefault(row["request_id"], {})[int(row["abs_pos"])] = row
    return out


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


def _tokens_html(
    ids: Sequence[int], texts: Sequence[str], rows: Mapping[int, Mapping], first: int | None
) -> str:
    """One output as coloured token spans, the first divergent one marked.

    Only a window of :data:`WINDOW` tokens each side of the first divergence is drawn:
    every span carries its details, so whole long outputs would make pages of tens of MB.
    """
    centre = first if first is not None else 0
    lo, hi = max(0, centre - WINDOW), min(len(ids), centre + WINDOW + 1)
    spans = [f'<span class="xp-end">… {lo} tokens before</span>'] if lo else []
    for t in range(lo, hi):
        token_id, text = ids[t], texts[t]
        row = rows.get(t)
        cls = f"tok {_cause_class(row)}" + (f" {FIRST_CLASS}" if t == first else "")
        spans.append(
            f'<span class="{cls}" title="{html.escape(_title(t, token_id, row))}">'
            f"{html.escape(text)}</span>"
        )
    if hi < len(ids):
        spans.append(f'<span class="xp-end">… {len(ids) - hi} tokens after</span>')
    if first is not None and first >= len(ids):
        spans.append('<span class="xp-end">▸ output ends here</span>')
    # <wbr>: lines break between tokens; overflow-wrap breaks inside only an over-long one.
    return "<wbr>".join(spans)


def _verdict_line(pair: Mapping[str, Any]) -> str:
    """Where the outputs first differ, and the attribution of that divergence (escaped)."""
    first = pair["first_pos"]
    if first is None:
        return "identical outputs"
    why = pair.get("attribution") or "?"
    ended = len(pair.get("output_ids_rel") or []) <= first
    cause = pair.get("cause") or ("the relaxed output ended first" if ended else "no position row")
    kind = f", {pair['kind']} row" if pair.get("kind") else ""
    text = f"first divergence at token {first}: {why} ({cause}{kind})"
    return html.escape(text)


def _score_line(pair: Mapping[str, Any]) -> str:
    """Scores of both sides, or nothing for a task without a scorer."""
    rel, ref = pair.get("score_rel"), pair.get("score_ref")
    if rel is None and ref is None:
        return ""
    return f" · score: reference {html.escape(_num(ref))}, relaxed {html.escape(_num(rel))}"


def _request_html(
    pair: Mapping[str, Any],
    rel_rows: Mapping[int, Mapping],
    ref_rows: Mapping[int, Mapping],
    tokenizer: Any,
    labels: tuple[str, str],
) -> str:
    """One request pair: item id, attribution, scores, and the two outputs side by side."""
    first = pair["first_pos"]
    sides = []
    for label, suffix, rows in ((labels[0], "_ref", ref_rows), (labels[1], "_rel", rel_rows)):
        ids = list(pair[f"output_ids{suffix}"] or [])
        texts = _token_texts(tokenizer, ids)
        sides.append(
            f'<div class="xp-side"><h4>{html.escape(label)} <span class="muted">'
            f"({len(ids)} tokens, stop: {html.escape(str(pair.get(f'stop{suffix}')))})"
            f'</span></h4><div class="xp-tokens">{_tokens_html(ids, texts, rows, first)}'
            "</div></div>"
        )
    sample = f" #{pair['sample']}" if pair.get("sample") else ""
    return (
        f'<div class="xp-req"><h3>{html.escape(str(pair["item_id"]) + sample)}</h3>'
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


def _run_id(run_dir: str) -> str:
    from relaxspec_audit.collect import logs

    return str(logs.read_manifest(run_dir).get("run_id"))


def _tokenizer_for(run_dir: str) -> tuple[Any, str | None]:
    """The run's target tokenizer, or None with a sentence saying why (escaped)."""
    from relaxspec_audit.collect import logs

    path = _tokenizer_path(logs.read_manifest(run_dir))
    if path is None:
        return None, "the run's manifest names no tokenizer"
    tok, why = _load_tokenizer(path)
    if tok is None:
        return (
            None,
            f"the tokenizer at {html.escape(path)} could not be loaded from local "
            f"files ({html.escape(why or '')})",
        )
    return tok, None


def _section(
    row: Mapping[str, Any], ref_dir: str | None, ref_rule: str, cap: int
) -> tuple[str, str | None]:
    """One setting's section, and why token text is missing (None when it is not)."""
    head = (
        f"<h2>{html.escape(str(row['setting']))}</h2>\n"
        f'<p class="muted">run {html.escape(str(row["run_id"]))}'
    )
    if ref_dir is None:
        return (
            head + f"</p><p>No paired {html.escape(ref_rule)} reference run (same items, "
            "seed and sampling): nothing to compare.</p>",
            None,
        )
    pairs = _pairs(row["run_dir"], ref_dir, str(row["rule"]))
    diverged = pairs.filter(pairs["first_pos"].is_not_null())
    shown = diverged.head(cap)
    ids_rel = shown["request_id_rel"].to_list()
    rel_rows = _emitted(row["run_dir"], ids_rel)
    ref_rows = _emitted(ref_dir, shown["request_id_ref"].to_list())
    tokenizer, why = _tokenizer_for(row["run_dir"])
    n_rule = int((diverged["attribution"] == "rule").sum())
    n_num = int((diverged["attribution"] == "numerics").sum())
    n_none = diverged.height - n_rule - n_num
    unread = (
        f" {n_none} cannot be attributed (the run was collected without position logs)."
        if n_none
        else ""
    )
    body = [
        f" against {html.escape(ref_rule)} run {html.escape(_run_id(ref_dir))}"
        f"</p>\n<p>{diverged.height} of {pairs.height} outputs differ from the reference; "
        f"of the first divergences, {n_rule} are at a decision of the relaxed rule and "
        f"{n_num} are numerical.{unread}</p>"
    ]
    if diverged.height > cap:
        body.append(
            f'<p class="muted">Showing the {cap} of {diverged.height} diverged requests that '
            f"diverge earliest; {diverged.height - cap} more left out.</p>"
        )
    labels = (f"reference ({ref_rule})", f"relaxed ({row['setting']})")
    for pair in shown.iter_rows(named=True):
        body.append(
            _request_html(pair, rel_rows.get(pair["request_id_rel"], {}),
                          ref_rows.get(pair["request_id_ref"], {}), tokenizer, labels)
        )  # fmt: skip
    return head + "".join(body), why


def _style() -> str:
    # .muted is the report pages' class; a notebook fragment has no page CSS to take it from.
    return f"<style>{_CSS}.xp-root .muted {{ color: #59636e; }}</style>\n"


def _tokenizer_note(why: str | None) -> str:
    if why is None:
        return ""
    return f'<p class="muted">Token text unavailable: {why}; tokens show as #id.</p>\n'


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
    runs_dir: str | Path,
    task: str,
    rule: str,
    out: str | Path,
    *,
    split: str | None = "confirmation",
    max_requests: int = 50,
    title: str | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the divergence explorer page of one task and relaxed rule (module docstring).

    Every setting of ``rule`` on ``split`` gets a section, ordered by the setting's value:
    its diverged requests against the paired reference run (:func:`~.runs._match`), sorted
    by first divergent position and capped at ``max_requests`` (a note says how many were
    left out), with the attribution of each first divergence (THEORY §3).

    Args:
        runs_dir: folder of run folders.
        task: task name.
        rule: a relaxed rule (not a lossless reference).
        out: HTML file to write.
        split: the runs' split (None: runs collected without one).
        max_requests: diverged requests shown per setting.
        title: page title (default: names the rule, task and split).
        links: ``(label, href)`` pairs for the navigation bar (e.g. the index, the sign-off).

    Returns:
        ``out`` as a Path.

    Raises:
        ValueError: ``max_requests`` below 1, a lossless ``rule``, or no run of ``rule``
            on ``split`` (naming the runs there).
    """
    import polars as pl

    from relaxspec_audit.report.runs import _match, reference_rule, runs_table
    from relaxspec_audit.verify import registry

    if int(max_requests) < 1:
        raise ValueError(f"max_requests: must be at least 1, got {max_requests!r}")
    spec = registry.RULES.get(rule)
    if spec is None or spec.lossless:
        raise ValueError(f"rule: {rule!r} is not a relaxed rule of the registry")
    table = runs_table(runs_dir, task)
    mine = table.filter((pl.col("rule") == rule) & pl.col("split").eq_missing(split))
    if mine.height == 0:
        have = sorted({f"{r} on {s}" for r, s in table.select("rule", "split").iter_rows()})
        raise ValueError(
            f"rule: no {rule} run of task {task!r} on split {split!r} under {runs_dir}; "
            f"runs there: {', '.join(have) or 'none'}"
        )
    sections, why = [], None
    for row in mine.sort(["value", "setting", "run_id"], nulls_last=True).iter_rows(named=True):
        ref_rule = reference_rule(rule, row["temperature"])
        section, missing = _section(row, _match(table, row, ref_rule), ref_rule, int(max_requests))
        sections.append(f'<section class="xp-root">{section}</section>')
        why = why or missing
    body = _intro(task, rule, split) + _tokenizer_note(why) + _legend() + "\n".join(sections)
    nav = "".join(f'<a href="{html.escape(h)}">{html.escape(lbl)}</a>' for lbl, h in links)
    title = title or f"Divergence explorer · {task} · {rule} ({split or 'no split'})"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = _page(title, _style() + _no_scripts(body), f"<nav>{nav}</nav>\n" if links else "")
    out.write_text(page)
    return out


def _run_label(manifest: Mapping[str, Any]) -> str:
    """A run's setting label from its manifest (resolved through the registry)."""
    from relaxspec_audit.verify import registry

    cfg = manifest.get("config") or {}
    rule = str(cfg.get("rule"))
    if rule not in registry.RULES:
        return rule
    return registry.setting_label(rule, registry.resolve_params(rule, cfg.get("params")))


def request_view(rel_run_dir: str | Path, ref_run_dir: str | Path, request_id: str) -> str:
    """One request of a relaxed run beside its reference, as a self-contained HTML fragment.

    The divergence page's view of one request (with its own ``<style>``), for a notebook:
    ``IPython.display.HTML(request_view(rel, ref, "story-001"))``. An undiverged request
    shows both outputs with no marker.

    Args:
        rel_run_dir: the relaxed run's folder.
        ref_run_dir: its paired reference run's folder.
        request_id: the relaxed run's request id.

    Raises:
        ValueError: ``request_id`` is not a request of the relaxed run paired with one of
            the reference's.
    """
    import polars as pl

    from relaxspec_audit.collect import logs

    rel, ref = str(rel_run_dir), str(ref_run_dir)
    rel_manifest, ref_manifest = logs.read_manifest(rel), logs.read_manifest(ref)
    pairs = _pairs(rel, ref, str((rel_manifest.get("config") or {}).get("rule")))
    hit = pairs.filter(pl.col("request_id_rel") == request_id)
    if hit.height == 0:
        raise ValueError(
            f"request_id: {request_id!r} is not a request of {rel} paired with one of {ref}"
        )
    pair = hit.row(0, named=True)
    tokenizer, why = _tokenizer_for(rel)
    labels = (f"reference ({_run_label(ref_manifest)})", f"relaxed ({_run_label(rel_manifest)})")
    view = _request_html(pair, _emitted(rel, [request_id]).get(request_id, {}),
                         _emitted(ref, [pair["request_id_ref"]]).get(pair["request_id_ref"], {}),
                         tokenizer, labels)  # fmt: skip
    body = _tokenizer_note(why) + _legend() + view
    return _style() + f'<div class="xp-root">{_no_scripts(body)}</div>'
