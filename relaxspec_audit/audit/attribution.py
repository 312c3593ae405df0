"""Divergence attribution: was a first divergence the relaxed rule's, or numerics?

Two runs of one seed share each request's random stream (THEORY §4), so a relaxed run and
its lossless reference (``nucleus`` vs ``exact`` at T > 0, ``asd`` vs ``greedy`` at T = 0)
see the same prefix, drafts, ``q`` and uniforms until a decision differs. Every draft row
logs the reference's own test, ``passed_ratio`` (the ratio test ``u < min(1, p/q)``; token
equality with the target argmax in greedy mode, THEORY §2.2), beside the rule's decision
``accepted``. While the two agree on every reached draft, the relaxed run decides exactly
as the reference would on the same numbers, so its emitted token can only differ from the
reference run's through float differences between the two runs (a different batch
composition, a near-tie: THEORY §4 "Batching caveat").

So the first divergence of a request is the **rule**'s when some reached draft at or before
it was decided against the reference's test — an acceptance the relaxation granted
(``accepted ∧ ¬passed_ratio``: ``accept_nucleus``, ``accept_exception``, …) or a rejection
of a draft the test passed (``typical`` can; it moves later block boundaries) — and
**numerics** otherwise (THEORY §3 "Noise floor"). For NSD vs ``exact`` the rule's case is
exactly the ``accept_nucleus`` row at the divergence: a failed ratio test needs
``q(x) > p(x)``, where the residual is 0, so ``exact`` cannot emit ``x`` there (§2.3.4).

Rules whose recovery law is not the reference's (``typical`` recovers with the target
argmax, ``fuzzy`` samples ``p``; THEORY §2 table) can also diverge at a recovery after a
draft both tests rejected; ``rule_recovery=True`` counts such a recovery row as the rule's.

Only numpy, polars and statsmodels are imported: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from relaxspec_audit.audit.fidelity import first_divergence
from relaxspec_audit.audit.frames import CLUSTER, Frame, _lazy
from relaxspec_audit.audit.likelihood import emitted_rows

#: The attribution labels, in report order.
ATTRIBUTIONS = ("rule", "numerics")
_ROW_COLS = ("kind", "cause", "accepted", "passed_ratio", "round", "pos", "token")


def attribute_divergence(
    rel_positions: Frame,
    rel_requests: Frame,
    ref_requests: Frame,
    *,
    by: Sequence[str] = ("task",),
    rule_recovery: bool = False,
) -> pl.DataFrame:
    """Per diverged request: where the relaxed and reference outputs first differ, and why.

    Requests are paired by ``(*by, item_id, sample)`` (:func:`first_divergence`). For each
    pair whose outputs differ, ``first_pos`` is the 0-based output index of the first
    differing token (= ``abs_pos`` of the relaxed row that emitted it). That row's
    ``kind, cause, accepted, passed_ratio, round, pos, token`` are reported (null when the
    relaxed output ended before ``first_pos``: the reference's is longer), with
    ``departures`` = the relaxed run's reached draft rows at ``abs_pos ≤ first_pos``
    decided against the reference's test (``accepted ≠ passed_ratio``) and
    ``first_departure`` the earliest one's ``abs_pos``.

    ``attribution`` is ``"rule"`` when ``departures > 0`` (or, with ``rule_recovery``, when
    the emitting row is a recovery), else ``"numerics"`` (module docstring).

    Args:
        rel_positions: the relaxed run's ``positions`` (one run).
        rel_requests: the relaxed run's ``requests``.
        ref_requests: the reference run's ``requests`` (same task items and seed).
        by: grouping columns of the ``requests`` tables.
        rule_recovery: the rule's recovery law differs from the reference's (``typical``,
            ``fuzzy``): a divergence at a recovery row is the rule's.

    Returns:
        One row per diverged pair: ``*by, item_id, sample, request_id, first_pos,
        n_tokens, kind, cause, accepted, passed_ratio, round, pos, token, departures,
        first_departure, attribution``.
    """
    by = list(by)
    lf = _lazy(
        rel_positions,
        "rel_positions",
        [CLUSTER, "abs_pos", "kind", "cause", "accepted", "passed_ratio", "round", "pos", "token"],
    )
    names = lf.collect_schema().names()
    if "run_id" in names and lf.select(pl.col("run_id").n_unique()).collect().item() > 1:
        raise ValueError("rel_positions: rows of several runs; pass one relaxed run")
    div = first_divergence(rel_requests, ref_requests, by=by, keep=[CLUSTER])
    div = div.filter(pl.col("diverged")).select(
        *by,
        "item_id",
        "sample",
        pl.col(f"{CLUSTER}_rel").alias(CLUSTER),
        "first_pos",
        "n_tokens",
    )
    if div.height == 0:
        return _empty(by)
    at = div.select(CLUSTER, "first_pos").lazy()
    lf = lf.join(at, on=CLUSTER, how="inner").filter(pl.col("abs_pos") <= pl.col("first_pos"))
    emitted = (
        emitted_rows(lf)
        .filter(pl.col("abs_pos") == pl.col("first_pos"))
        .select(CLUSTER, *_ROW_COLS)
        .collect()
    )
    if emitted[CLUSTER].is_duplicated().any():
        rid = emitted.filter(pl.col(CLUSTER).is_duplicated())[CLUSTER][0]
        raise ValueError(f"rel_positions: request {rid!r} has two emitted rows at one abs_pos")
    departed = (
        lf.filter(
            (pl.col("kind") == "draft")
            & (pl.col("cause") != "not_reached")
            & (pl.col("accepted") != pl.col("passed_ratio"))
        )
        .group_by(CLUSTER)
        .agg(pl.len().alias("departures"), pl.col("abs_pos").min().alias("first_departure"))
        .collect()
    )
    out = (
        div.join(emitted, on=CLUSTER, how="left")
        .join(departed, on=CLUSTER, how="left")
        .with_columns(pl.col("departures").fill_null(0).cast(pl.Int64))
    )
    by_rule = pl.col("departures") > 0
    if rule_recovery:
        by_rule = by_rule | (pl.col("kind") == "recovery").fill_null(False)
    out = out.with_columns(
        pl.when(by_rule).then(pl.lit("rule")).otherwise(pl.lit("numerics")).alias("attribution")
    )
    return out.sort([*by, "item_id", "sample"])


def _empty(by: list[str]) -> pl.DataFrame:
    schema: dict[str, Any] = {c: pl.String() for c in by}
    schema.update(
        item_id=pl.String(),
        sample=pl.Int64(),
        request_id=pl.String(),
        first_pos=pl.Int64(),
        n_tokens=pl.UInt32(),
        kind=pl.String(),
        cause=pl.String(),
        accepted=pl.Boolean(),
        passed_ratio=pl.Boolean(),
        round=pl.Int32(),
        pos=pl.Int32(),
        token=pl.Int64(),
        departures=pl.Int64(),
        first_departure=pl.Int32(),
        attribution=pl.String(),
    )
    return pl.DataFrame(schema=schema)


def attribution_summary(
    attributed: pl.DataFrame, *, n_pairs: int | None = None, alpha: float = 0.05
) -> dict[str, Any]:
    """Counts per attribution and the share of first divergences that are the rule's.

    ``share_rule = n_rule / n_diverged`` with a Wilson score interval (Wilson 1927;
    statsmodels ``proportion_confint``) when requests are the independent units, and the
    Korn–Graubard interval clustered by item (``clustered_share``) when an item has
    several diverged samples. Also the
    causes at the rule's divergences (e.g. ``{"accept_nucleus": 7}``).

    Args:
        attributed: :func:`attribute_divergence`'s result.
        n_pairs: paired requests in all (diverged or not), reported as ``n_pairs``.
        alpha: 1 − confidence level.

    Returns:
        ``{"n_pairs", "n_diverged", "counts": {label: n}, "share_rule", "ci_low",
        "ci_high", "causes": {cause: n}}`` (shares null when nothing diverged).
    """
    from statsmodels.stats.proportion import proportion_confint

    missing = {"attribution", "cause"} - set(attributed.columns)
    if missing:
        raise ValueError(f"attributed: missing column(s) {sorted(missing)}")
    n = attributed.height
    counts = {a: int((attributed["attribution"] == a).sum()) for a in ATTRIBUTIONS}
    rule = attributed.filter(pl.col("attribution") == "rule")
    causes = rule.group_by("cause").len().sort(["len", "cause"], descending=[True, False])
    out: dict[str, Any] = {
        "n_pairs": n_pairs,
        "n_diverged": n,
        "counts": counts,
        "share_rule": None,
        "ci_low": None,
        "ci_high": None,
        "causes": {str(c): int(k) for c, k in causes.iter_rows()},
    }
    if n and "item_id" in attributed.columns and attributed["item_id"].is_duplicated().any():
        # Several samples of one item diverge together: the item is the cluster.
        from relaxspec_audit.audit.intervals import clustered_share

        per_item = attributed.group_by("item_id").agg(
            (pl.col("attribution") == "rule").sum().alias("_rule"), pl.len().alias("_n")
        )
        row = clustered_share(per_item, "_rule", "_n", alpha=alpha).row(0, named=True)
        out.update(share_rule=counts["rule"] / n, ci_low=row["ci_low"], ci_high=row["ci_high"])
    elif n:
        lo, hi = proportion_confint(counts["rule"], n, alpha=alpha, method="wilson")
        out.update(share_rule=counts["rule"] / n, ci_low=float(lo), ci_high=float(hi))
    return out
