"""Pairing two runs' requests on the same task items, sample by sample.

The paired statistics of THEORY §3 (accuracy delta, hash divergence, paired speedup)
compare a relaxed run with its reference (or a baseline) item by item; this module
builds those pairs once, the same way for all of them.

Only polars is imported: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from relaxspec_audit.audit.frames import Frame, _lazy
from relaxspec_audit.collect.config import SAMPLE_SEP


def sample_index(request_id: pl.Expr, item_id: pl.Expr) -> pl.Expr:
    """The sample index a request id carries: 0 for ``item``, ``j`` for ``item#j``, else null.

    The inverse of :func:`relaxspec_audit.collect.config.sample_request_id` (the ids a run
    with ``samples_per_item > 1`` logs).
    """
    prefix = item_id + pl.lit(SAMPLE_SEP)
    suffix = request_id.str.strip_prefix(prefix)
    return (
        pl.when(request_id == item_id)
        .then(pl.lit(0, dtype=pl.Int64))
        .when(request_id.str.starts_with(prefix) & suffix.str.contains(r"^[0-9]+$"))
        .then(suffix.cast(pl.Int64, strict=False))
        .otherwise(pl.lit(None, dtype=pl.Int64))
    )


def pair_requests(
    requests: Frame,
    reference: Frame,
    columns: Sequence[str],
    *,
    by: Sequence[str] = ("task",),
) -> pl.DataFrame:
    """Join two runs' requests on the same items, sample j with sample j.

    Within a group (``by``) and an item, a request has a run (the dense rank of its
    ``run_id`` among the runs holding that item) and a sample: the index its request id
    carries (``item`` → 0, ``item#j`` → j; runs with ``samples_per_item > 1``,
    :func:`sample_index`) when every request id of the frame carries one, else its rank
    by ``request_id`` within the run. Rows are matched on ``(*by, item_id, run, sample)``:
    the k-th run of each side with the k-th, sample j with sample j, so two runs on one
    seed pair the requests that share a random stream (THEORY §4). ``item_id`` is kept:
    it is the cluster of every paired statistic (samples of one item are not independent).

    Args:
        requests: the relaxed run(s)' ``requests`` table.
        reference: the reference run(s)' ``requests`` table.
        columns: columns to keep from both sides, suffixed ``_rel`` and ``_ref``.
        by: grouping columns present in both (items are unique within a group).

    Returns:
        Columns ``*by, item_id, sample, <col>_rel, <col>_ref`` for each column, where
        ``sample`` ranks the relaxed side's paired request within its item by (run,
        sample) — the sample index itself for one run.

    Raises:
        ValueError: a missing column, or no item in common.
    """
    by = list(by)
    group = [*by, "item_id"]

    def prep(frame: Frame, name: str, suffix: str) -> pl.DataFrame:
        lf = _lazy(frame, name, ["item_id", *by, *columns])
        have = lf.collect_schema().names()
        run = (
            (pl.col("run_id").rank("dense").over(group) - 1).cast(pl.Int64)
            if "run_id" in have
            else pl.lit(0, dtype=pl.Int64)
        )
        parsed = (
            sample_index(pl.col("request_id"), pl.col("item_id"))
            if "request_id" in have
            else pl.lit(None, dtype=pl.Int64)
        )
        df = lf.select(
            *group,
            run.alias("_run"),
            parsed.alias("_sample"),
            *([pl.col("request_id").alias("_rid")] if "request_id" in have else []),
            *[pl.col(c).alias(f"{c}{suffix}") for c in columns],
        ).collect()
        if df.height == 0 or df["_sample"].null_count() > 0:
            # Ids that carry no sample index (other naming, synthetic frames): rank by
            # request id within the run, by a window rather than a sort of the whole frame
            # (the frame may carry long list columns, output_ids, that are costly to move).
            order = "_rid" if "_rid" in df.columns else None
            rank = pl.int_range(pl.len()).over([*group, "_run"], order_by=order)
            df = df.with_columns(rank.cast(pl.Int64).alias("_sample"))
        return df.drop("_rid", strict=False)

    rel = prep(requests, "requests", "_rel")
    ref = prep(reference, "reference", "_ref")
    key = [*group, "_run", "_sample"]
    out = rel.join(ref, on=key, how="inner")
    if out.height == 0:
        raise ValueError(
            "requests vs reference: no (item_id, sample) in common — are they runs of the "
            f"same task items? grouping by {by}"
        )
    sample = pl.int_range(pl.len()).over(group, order_by=["_run", "_sample"]).cast(pl.Int64)
    out = out.with_columns(sample.alias("sample")).drop("_run", "_sample")
    return out.select(*group, "sample", *[c for c in out.columns if c not in (*group, "sample")])


#: Column :func:`with_position_unit` adds: the item a position's request sampled.
ITEM_UNIT = "_item"


def with_position_unit(positions: pl.DataFrame, requests: Frame) -> tuple[pl.DataFrame, str]:
    """Positions with the cluster their shares use, and its column name.

    The request when every item has one sample; the item when some have several, since an
    item's samples share its prompt and their positions are correlated (docs/STATISTICS.md,
    "The unit of every number": requests nested in items, clustered at the top).
    """
    rq = _lazy(requests, "requests", ["request_id", "item_id"])
    rq = rq.select("request_id", "item_id").unique("request_id").collect()
    if rq.height == 0 or rq["item_id"].n_unique() == rq.height:
        return positions, "request_id"
    unit = rq.select(pl.col("request_id").cast(pl.String), pl.col("item_id").alias(ITEM_UNIT))
    keyed = positions.with_columns(pl.col("request_id").cast(pl.String).alias("_rq"))
    out = keyed.join(unit, left_on="_rq", right_on="request_id", how="left").drop("_rq")
    if out[ITEM_UNIT].null_count():
        missing = out.filter(pl.col(ITEM_UNIT).is_null())["request_id"].head(3).to_list()
        raise ValueError(f"positions: request(s) {missing} are not in the requests table")
    return out, ITEM_UNIT
