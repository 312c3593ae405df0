"""Log-likelihood fidelity: do the emitted tokens stay as likely under the target?

For open-ended tasks (no scorer) divergence alone says only *that* a relaxed run's output
differs from its reference's, not whether it got worse. This module measures how likely
the emitted text is under the **untransformed** target distribution (softmax of the raw
target logits at T = 1, no top-k/top-p: the ``logp_target`` column of ``positions``):
per request the mean ``logp_target`` over its emitted tokens, paired item by item between
the relaxed run and its reference, and the mean paired difference with a t interval on
item means (items are the independent units, as for the accuracy delta, THEORY §3;
docs/STATISTICS.md). A relaxed rule that accepts drafts the target finds unlikely lowers it.

Only numpy, polars and scipy are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import CLUSTER, Frame, _lazy
from relaxspec_audit.audit.pairing import pair_requests

#: The positions column this module reads (collect/schema.py; absent in older logs).
LOGP = "logp_target"


def emitted_rows(lf: pl.LazyFrame) -> pl.LazyFrame:
    """The ``positions`` rows whose token was emitted.

    Accepted drafts, and every recovery and bonus row: the decoder logs a recovery or
    bonus row only when it was emitted (a round cut by EOS, a stop string or the length
    limit logs just its emitted drafts and no recovery/bonus row), and a target-only run's
    rows are all ``bonus``. So a request has exactly ``n_tokens`` emitted rows.
    """
    return lf.filter((pl.col("kind") != "draft") | pl.col("accepted").fill_null(False))


def emitted_loglik(positions: Frame, *, cluster: str = CLUSTER) -> pl.DataFrame | None:
    """Per request: the mean and sum of ``logp_target`` over its emitted tokens.

    Returns:
        Columns ``request_id, n_emitted, loglik_sum, loglik_mean`` (the run key
        ``run_id`` first when the frame has it), or None when the log has no
        ``logp_target`` values (written before the column, or without position logs).
    """
    lf = _lazy(positions, "positions", [cluster, "kind", "accepted"])
    names = lf.collect_schema().names()
    if LOGP not in names:
        return None
    keys = [c for c in ("run_id",) if c in names and c != cluster] + [cluster]
    per = (
        emitted_rows(lf)
        .group_by(keys)
        .agg(
            pl.len().alias("n_emitted"),
            pl.col(LOGP).null_count().alias("_nulls"),
            pl.col(LOGP).cast(pl.Float64).sum().alias("loglik_sum"),
        )
        .collect()
    )
    if per.height == 0 or per["_nulls"].sum() == per["n_emitted"].sum():
        return None
    if per["_nulls"].sum():
        bad = per.filter(pl.col("_nulls") > 0)[cluster][0]
        raise ValueError(
            f"positions: {LOGP} is null on some emitted rows of request {bad!r} but not on "
            "others; a run mixes logs written before and after the column (re-collect it)"
        )
    return per.drop("_nulls").with_columns(
        (pl.col("loglik_sum") / pl.col("n_emitted")).alias("loglik_mean")
    )


def _request_loglik(positions: Frame, requests: Frame, name: str) -> pl.DataFrame | None:
    """``requests`` with ``loglik_mean`` joined on (and checked against ``n_tokens``)."""
    per = emitted_loglik(positions)
    if per is None:
        return None
    req = _lazy(requests, name, [CLUSTER, "item_id", "n_tokens"]).collect()
    on = [c for c in ("run_id", CLUSTER) if c in per.columns and c in req.columns]
    out = req.join(per, on=on, how="left")
    bad = out.filter(
        pl.col("n_emitted").is_not_null() & (pl.col("n_emitted") != pl.col("n_tokens"))
    )
    if bad.height:
        row = bad.row(0, named=True)
        raise ValueError(
            f"{name}: request {row[CLUSTER]!r} has {row['n_emitted']} emitted position rows "
            f"but n_tokens = {row['n_tokens']}; the positions and requests tables disagree"
        )
    return out


def loglik_delta(
    rel_positions: Frame,
    rel_requests: Frame,
    ref_positions: Frame,
    ref_requests: Frame,
    *,
    alpha: float = 0.05,
    by: Sequence[str] = ("task",),
) -> pl.DataFrame:
    """Paired difference in mean emitted-token log-likelihood, relaxed − reference.

    Per request ``ℓ = (1/T) Σ_t log p_target(y_t | y_<t)`` over its ``T`` emitted tokens,
    ``p_target`` the untransformed target distribution (``logp_target``). Requests are
    paired by ``(*by, item_id, sample)`` (:func:`pair_requests`) and averaged per item over
    samples, so the ``n`` items are the independent units; on the item differences
    ``d_i = ℓ̄_rel,i − ℓ̄_ref,i``: ``delta = d̄``, ``CI = d̄ ± t_{1−α/2, n−1}·s/√n`` (paired t,
    clustered by item; docs/STATISTICS.md). Negative: the relaxed run emits text the
    target finds less likely (nats per token).

    Args:
        rel_positions: the relaxed run's ``positions`` (``logp_target``).
        rel_requests: the relaxed run's ``requests``.
        ref_positions: the reference run's ``positions``.
        ref_requests: the reference run's ``requests`` (same task items).
        alpha: 1 − confidence level.
        by: grouping columns of the ``requests`` tables (one row per group).

    Returns:
        One row per group: ``*by, available, n_items, n_pairs, loglik_ref, loglik_rel,
        delta, se, ci_low, ci_high``. ``available`` is False and the statistics null when
        either run lacks ``logp_target`` (logs written before the column, or without
        position logs).
    """
    from scipy import stats as sps

    if not 0 < alpha < 1:
        raise ValueError(f"alpha: must be in (0, 1), got {alpha}")
    by = list(by)
    rel = _request_loglik(rel_positions, rel_requests, "rel_requests")
    ref = _request_loglik(ref_positions, ref_requests, "ref_requests")
    stats = ("loglik_ref", "loglik_rel", "delta", "se", "ci_low", "ci_high")
    if rel is None or ref is None:
        pairs = pair_requests(rel_requests, ref_requests, ["n_tokens"], by=by)
        keys = by or [pl.lit(0).alias("_all")]
        out = pairs.group_by(keys, maintain_order=True).agg(
            pl.col("item_id").n_unique().alias("n_items"), pl.len().alias("n_pairs")
        )
        out = out.with_columns(pl.lit(False).alias("available"))
        out = out.with_columns(pl.lit(None, pl.Float64).alias(c) for c in stats)
        return out.select(*by, "available", "n_items", "n_pairs", *stats)
    pairs = pair_requests(rel, ref, ["loglik_mean"], by=by).drop_nulls(
        ["loglik_mean_rel", "loglik_mean_ref"]
    )
    if pairs.height == 0:
        raise ValueError("rel vs ref: no paired request has emitted-token log-likelihoods")
    rows = []
    groups = pairs.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pairs}
    for key, part in groups.items():
        items = part.group_by("item_id", maintain_order=True).agg(
            pl.col("loglik_mean_rel").mean(), pl.col("loglik_mean_ref").mean()
        )
        x_rel = items["loglik_mean_rel"].to_numpy()  # [n_items]
        x_ref = items["loglik_mean_ref"].to_numpy()
        d = x_rel - x_ref
        n = len(d)
        mean = float(d.mean())
        se = float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
        tq = float(sps.t.ppf(1 - alpha / 2, n - 1)) if n > 1 else math.nan
        row = dict(zip(by, key, strict=True))
        row.update(
            available=True,
            n_items=n,
            n_pairs=part.height,
            loglik_ref=float(np.mean(x_ref)),
            loglik_rel=float(np.mean(x_rel)),
            delta=mean,
            se=se,
            ci_low=mean - tq * se,
            ci_high=mean + tq * se,
        )
        rows.append(row)
    return pl.DataFrame(rows).select(*by, "available", "n_items", "n_pairs", *stats)
