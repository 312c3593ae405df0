"""Which outputs a relaxed rule changed, where first, and why: the explorer's data.

For a task, a relaxed rule and a split, one entry per setting: each request whose output
differs from its paired reference run's (THEORY §4 pairing: same items, seed and sampling,
so both see one random stream until a decision differs), both outputs token by token with
the position row that emitted each token (its kind, cause and the two tests a draft row
logs, THEORY §2), and the attribution of the first divergence to the rule or to numerics
(:func:`~relaxspec_audit.audit.attribution.attribute_divergence`, THEORY §3 "Noise floor").
:mod:`relaxspec_audit.report.explorer` renders it; nothing here writes a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.audit.records import Record
from relaxspec_audit.audit.runs import TaskRuns
from relaxspec_audit.collect.manifest import RunManifest
from relaxspec_audit.verify import registry

#: Attribution of a divergence in a run logged without positions (no decision to read).
UNATTRIBUTED = "unattributed"
#: Columns of an emitting position row kept for each token.
ROW_COLS = ("kind", "round", "pos", "accepted", "passed_ratio", "cause", "p", "q", "rank",
            "mass_above", "entropy_p", "entropy_q", "logp_target")  # fmt: skip


class Token(Record):
    """One emitted token: its id, its text (None without a tokenizer), its position row."""

    id: int
    text: str | None
    row: dict[str, Any] | None  # ROW_COLS of the row that emitted it (None: not logged)


class Output(Record):
    """One side of a pair: who emitted it, why it stopped, its tokens."""

    label: str
    stop: str | None
    tokens: list[Token]


class Pair(Record):
    """A request of the relaxed run beside the reference's on the same item and sample."""

    item_id: str
    sample: int
    request_id_rel: str
    request_id_ref: str
    first_pos: int | None  # None: identical outputs
    attribution: str | None  # "rule", "numerics", "unattributed" (None: identical)
    cause: str | None
    kind: str | None
    score_rel: float | None
    score_ref: float | None
    reference: Output
    relaxed: Output


class SettingDivergences(Record):
    """One setting's diverged requests against its paired reference run."""

    setting: str
    run_id: str | None
    reference_rule: str
    reference_run_id: str | None  # None: no paired reference run
    n_pairs: int
    n_diverged: int
    n_rule: int
    n_numerics: int
    pairs: list[Pair]  # the first ``max_requests`` by first divergent position
    tokenizer_note: str | None


class Divergences(Record):
    """The explorer's data for one task, relaxed rule and split."""

    task: str
    rule: str
    split: str | None
    settings: list[SettingDivergences]


def _tokenizer_path(manifest: RunManifest) -> str | None:
    """Where the run's target tokenizer was loaded from (its manifest's models, else config)."""
    models = manifest.models
    for where in ((models.get("tokenizer") or {}).get("name_or_path"),
                  (models.get("target") or {}).get("path"), manifest.config.target):  # fmt: skip
        if where:
            return str(where)
    return None


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> tuple[Any, str | None]:
    """``(tokenizer, None)``, or ``(None, why)`` when it cannot be loaded from local files.

    A local folder goes through the collector's loader (it keeps a saved generic tokenizer
    as saved); a hub id is read from the local cache only: an audit never touches the
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


def tokenizer_of(manifest: RunManifest) -> tuple[Any, str | None]:
    """The run's target tokenizer, or None with a sentence saying why."""
    path = _tokenizer_path(manifest)
    if path is None:
        return None, "the run's manifest names no tokenizer"
    tok, why = _load_tokenizer(path)
    if tok is None:
        return None, f"the tokenizer at {path} could not be loaded from local files ({why})"
    return tok, None


def _texts(tokenizer: Any, ids: Sequence[int]) -> list[str | None]:
    if tokenizer is None:
        return [None] * len(ids)
    return [tokenizer.decode([int(i)]) for i in ids]


def pairs(rel_dir: str, ref_dir: str, rule: str, manifest: RunManifest) -> pl.DataFrame:
    """Every request pair of two runs with where its outputs first differ and why.

    Pairing and first positions are :func:`~relaxspec_audit.audit.fidelity.first_divergence`'s;
    ``attribution``/``cause``/``kind`` of each diverged pair are ``attribute_divergence``'s
    (null when identical). Sorted by first divergent position (identical pairs last), then
    item.
    """
    from relaxspec_audit.audit.attribution import attribute_divergence
    from relaxspec_audit.audit.fidelity import first_divergence
    from relaxspec_audit.collect import logs

    rel_req = logs.scan([rel_dir], "requests").collect()
    ref_req = logs.scan([ref_dir], "requests").collect()
    keep = ["request_id", "output_ids", "score", "stop"]
    out = first_divergence(rel_req, ref_req, by=[], keep=keep)
    spec = registry.RULES.get(rule)
    att = attribute_divergence(logs.scan([rel_dir], "positions"), rel_req, ref_req, by=[],
                               rule_recovery=bool(spec and spec.own_recovery))  # fmt: skip
    att = att.select(pl.col("request_id").alias("request_id_rel"), "attribution", "cause", "kind")
    out = out.join(att, on="request_id_rel", how="left")
    if not manifest.config.log_positions:
        # Without position rows no decision can be read: never call such a divergence
        # "numerics" (attribute_divergence finds no departure there).
        diverged = pl.col("first_pos").is_not_null()
        out = out.with_columns(
            pl.when(diverged).then(pl.lit(UNATTRIBUTED)).otherwise(None).alias("attribution"),
            pl.lit(None, pl.String).alias("cause"),
            pl.lit(None, pl.String).alias("kind"),
        )
    return out.sort(["first_pos", "item_id", "sample"], nulls_last=True)


def _emitted(run_dir: str, request_ids: Sequence[str]) -> dict[str, dict[int, dict]]:
    """Per request, output index → the position row that emitted that token.

    Emitted rows are :func:`~relaxspec_audit.audit.likelihood.emitted_rows`'s (one per
    output token), and their ``abs_pos`` is the output index. A run without position logs
    gives {}.
    """
    from relaxspec_audit.audit.likelihood import emitted_rows
    from relaxspec_audit.collect import logs

    lf = logs.scan([run_dir], "positions")
    cols = ["request_id", "abs_pos", *(c for c in ROW_COLS if c in lf.collect_schema().names())]
    rows = (
        emitted_rows(lf.filter(pl.col("request_id").is_in(list(request_ids))))
        .select(cols)
        .collect()
    )
    out: dict[str, dict[int, dict]] = {}
    for row in rows.iter_rows(named=True):
        rid, t = row.pop("request_id"), int(row.pop("abs_pos"))
        out.setdefault(rid, {})[t] = row
    return out


def _output(label: str, ids: Sequence[int], stop: Any, rows: dict[int, dict], tok: Any) -> Output:
    texts = _texts(tok, ids)
    tokens = [Token(id=int(i), text=texts[t], row=rows.get(t)) for t, i in enumerate(ids)]
    return Output(label=label, stop=None if stop is None else str(stop), tokens=tokens)


def _pair(
    row: dict[str, Any], rel_rows: dict, ref_rows: dict, tok: Any, labels: tuple[str, str]
) -> Pair:
    return Pair(
        item_id=str(row["item_id"]),
        sample=int(row.get("sample") or 0),
        request_id_rel=row["request_id_rel"],
        request_id_ref=row["request_id_ref"],
        first_pos=row["first_pos"],
        attribution=row.get("attribution"),
        cause=row.get("cause"),
        kind=row.get("kind"),
        score_rel=row.get("score_rel"),
        score_ref=row.get("score_ref"),
        reference=_output(
            labels[0], row["output_ids_ref"] or [], row.get("stop_ref"), ref_rows, tok
        ),
        relaxed=_output(labels[1], row["output_ids_rel"] or [], row.get("stop_rel"), rel_rows, tok),
    )


def setting_divergences(
    runs: TaskRuns, row: dict[str, Any], *, max_requests: int = 50
) -> SettingDivergences:
    """One setting's section: its diverged requests against the paired reference run."""
    ref_rule, ref_dir = runs.reference_of(row)
    manifest = runs.manifest(row["run_dir"])
    if ref_dir is None:
        return SettingDivergences(
            setting=row["setting"], run_id=row["run_id"], reference_rule=ref_rule,
            reference_run_id=None, n_pairs=0, n_diverged=0, n_rule=0, n_numerics=0,
            pairs=[], tokenizer_note=None,
        )  # fmt: skip
    table = pairs(row["run_dir"], ref_dir, row["rule"], manifest)
    diverged = table.filter(pl.col("first_pos").is_not_null())
    shown = diverged.head(max_requests)
    rel_rows = _emitted(row["run_dir"], shown["request_id_rel"].to_list())
    ref_rows = _emitted(ref_dir, shown["request_id_ref"].to_list())
    tok, why = tokenizer_of(manifest)
    labels = (f"reference ({ref_rule})", f"relaxed ({row['setting']})")
    return SettingDivergences(
        setting=row["setting"],
        run_id=row["run_id"],
        reference_rule=ref_rule,
        reference_run_id=runs.manifest(ref_dir).run_id,
        n_pairs=table.height,
        n_diverged=diverged.height,
        n_rule=int((diverged["attribution"] == "rule").sum()),
        n_numerics=int((diverged["attribution"] == "numerics").sum()),
        pairs=[
            _pair(
                p,
                rel_rows.get(p["request_id_rel"], {}),
                ref_rows.get(p["request_id_ref"], {}),
                tok,
                labels,
            )
            for p in shown.iter_rows(named=True)
        ],
        tokenizer_note=why,
    )


def divergences(
    runs: TaskRuns, rule: str, *, split: str | None = "confirmation", max_requests: int = 50
) -> Divergences:
    """The explorer's data of one task and relaxed rule: one entry per setting on ``split``.

    Settings are ordered by their value; each holds its diverged requests sorted by first
    divergent position, the first ``max_requests`` of them (``n_diverged`` says how many
    there are).

    Raises:
        ValueError: ``max_requests`` below 1, a lossless ``rule``, or no run of ``rule``
            on ``split`` (naming the runs there).
    """
    if int(max_requests) < 1:
        raise ValueError(f"max_requests: must be at least 1, got {max_requests!r}")
    spec = registry.RULES.get(rule)
    if spec is None or spec.lossless:
        raise ValueError(f"rule: {rule!r} is not a relaxed rule of the registry")
    table = runs.table
    mine = table.filter((pl.col("rule") == rule) & pl.col("split").eq_missing(split))
    if mine.height == 0:
        have = sorted({f"{r} on {s}" for r, s in table.select("rule", "split").iter_rows()})
        raise ValueError(
            f"rule: no {rule} run of task {runs.task!r} on split {split!r} under "
            f"{runs.runs_dir}; runs there: {', '.join(have) or 'none'}"
        )
    sections = [
        setting_divergences(runs, row, max_requests=int(max_requests))
        for row in mine.sort(["value", "setting", "run_id"], nulls_last=True).iter_rows(named=True)
    ]
    return Divergences(task=str(runs.task), rule=rule, split=split, settings=sections)


def request_pair(
    rel_run_dir: str | Path, ref_run_dir: str | Path, request_id: str
) -> tuple[Pair, str | None]:
    """One request of a relaxed run beside its reference (for a notebook's view).

    Returns:
        The pair, and why its token text is missing (None when it is not).

    Raises:
        ValueError: ``request_id`` is not a request of the relaxed run paired with one of
            the reference's.
    """
    from relaxspec_audit.collect import logs

    rel, ref = str(rel_run_dir), str(ref_run_dir)
    rel_m, ref_m = logs.read_manifest(rel), logs.read_manifest(ref)
    table = pairs(rel, ref, rel_m.rule, rel_m)
    hit = table.filter(pl.col("request_id_rel") == request_id)
    if hit.height == 0:
        raise ValueError(
            f"request_id: {request_id!r} is not a request of {rel} paired with one of {ref}"
        )
    row = hit.row(0, named=True)
    tok, why = tokenizer_of(rel_m)
    labels = (f"reference ({ref_m.label})", f"relaxed ({rel_m.label})")
    pair = _pair(row, _emitted(rel, [request_id]).get(request_id, {}),
                 _emitted(ref, [row["request_id_ref"]]).get(row["request_id_ref"], {}),
                 tok, labels)  # fmt: skip
    return pair, why
