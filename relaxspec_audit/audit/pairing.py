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


def pair_requests(
    requests: Frame,
    reference: Frame,
    columns: Sequence[str],
    *,
    by: Sequence[str] = ("task",),
) -> pl.DataFrame:
    """Join two runs' requests on the same items, sample by sample.

    Rows are matched on ``(*by, item_id, sample)`` where ``sample`` is the rank of the
    request among those of the same item (ordered by ``run_id``, then ``request_id``),
    so an item with several samples (seeds) pairs its first with the other's first.

    Args:
        requests: the relaxed run(s)' ``requests`` table.
        reference: the reference run(s)' ``requests`` table.
        columns: columns to keep from both sides, suffixed ``_rel`` and ``_ref``.
        by: grouping columns present in both (items are unique within a group).

    Returns:
        Columns ``*by, item_id, sample, <col>_rel, <col>_ref`` for each column.

    Raises:
        ValueError: a missing column, or no item in common.
    """
    by = list(by)
    order = ["run_id", "request_id"]

    def prep(frame: Frame, name: str, suffix: str) -> pl.DataFrame:
        lf = _lazy(frame, name, ["item_id", *by, *columns])
        extra = [c for c in order if c in lf.collect_schema().names()]
        # Rank within the item by a window, not a sort of the whole frame: the frame
        # may carry long list columns (output_ids) that are costly to move.
        rank = pl.int_range(pl.len()).over([*by, "item_id"], order_by=extra or None)
        return lf.select(
            *by,
            "item_id",
            rank.alias("sample"),
            *[pl.col(c).alias(f"{c}{suffix}") for c in columns],
        ).collect()

    rel = prep(requests, "requests", "_rel")
    ref = prep(reference, "reference", "_ref")
    out = rel.join(ref, on=[*by, "item_id", "sample"], how="inner")
    if out.height == 0:
        raise ValueError(
            "requests vs reference: no (item_id, sample) in common — are they runs of the "
            f"same task items? grouping by {by}"
        )
    return out
