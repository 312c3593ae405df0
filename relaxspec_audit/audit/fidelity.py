"""Output fidelity: does a relaxed run reproduce its reference's output (THEORY §2.3, §3)?

Measured: the share of requests whose output differs from the reference run's (THEORY §3
"Hash divergence"), with a Wilson interval (Wilson 1927; statsmodels
``proportion_confint``) when requests are independent and an item-clustered interval
when an item has several samples, and where the outputs first differ. Bounded: under coupled
randomness (THEORY §4) an NSD run reproduces the ``exact`` run's output with probability
``≥ Π_t (1 − ε_t)``, from the per-step deviations ``E_S`` logged at each θ of the run's
grid (THEORY §2.3, deviation accounting); :func:`deviation_accounting` sets the two side
by side. Means over positions are clustered by request
(:func:`relaxspec_audit.audit.intervals.clustered_ratio`, CR1; Cameron & Miller 2015).

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import CLUSTER, Frame, _draft_rows, _lazy
from relaxspec_audit.audit.intervals import clustered_ratio, clustered_share
from relaxspec_audit.audit.pairing import pair_requests

# ----------------------------------------------------------------------------------------
# Hash divergence (THEORY §3 "Hash divergence")
# ----------------------------------------------------------------------------------------


def _first_diff(a: pl.Series, b: pl.Series) -> np.ndarray:
    """0-based first index where paired token lists differ, −1 if identical.

    If one list is a prefix of the other, the shorter length. Vectorised: both lists are
    cut to their common length ``m``, flattened, compared, and the first mismatch of each
    pair found with ``np.minimum.reduceat`` over the flat positions.
    """
    la = a.list.len().fill_null(0).to_numpy().astype(np.int64)  # [P]
    lb = b.list.len().fill_null(0).to_numpy().astype(np.int64)
    m = np.minimum(la, lb)  # [P]
    df = pl.DataFrame({"a": a, "b": b, "m": m})
    # Null lists explode to one null row (dropped); tokens themselves are never null.
    fa, fb = (
        df.select(pl.col(c).list.head(pl.col("m")).explode(empty_as_null=False))
        .to_series()
        .drop_nulls()
        .to_numpy()  # [Σm]
        for c in ("a", "b")
    )
    big = np.iinfo(np.int64).max
    first = np.full(len(m), big, dtype=np.int64)
    if len(fa):
        offsets = np.concatenate([[0], np.cumsum(m)[:-1]])  # [P]
        within = np.arange(len(fa)) - np.repeat(offsets, m)  # position inside its list
        cand = np.where(fa != fb, within, big)
        nz = m > 0
        first[nz] = np.minimum.reduceat(cand, offsets[nz])
    return np.where(first != big, first, np.where(la != lb, m, -1))


def first_divergence(
    requests: Frame,
    reference: Frame,
    *,
    by: Sequence[str] = ("task",),
    keep: Sequence[str] = (),
) -> pl.DataFrame:
    """Per paired request: did the output differ, and where first.

    ``diverged = output_sha256 ≠ reference output_sha256``; ``first_pos`` is the
    0-based index of the first differing token of ``output_ids`` (the shorter length if
    one output is a prefix of the other), null when identical.

    Args:
        requests: the relaxed run's ``requests``.
        reference: the reference run's ``requests``.
        by: grouping columns present in both.
        keep: more ``requests`` columns to carry from both sides, suffixed ``_rel`` and
            ``_ref`` (e.g. ``request_id``, to find a request's ``positions`` rows).

    Returns:
        Columns ``*by, item_id, sample, diverged, first_pos, n_tokens`` and the kept ones.
    """
    by = list(by)
    extra = [c for c in keep if c not in ("output_sha256", "output_ids")]
    pairs = pair_requests(requests, reference, ["output_sha256", "output_ids", *extra], by=by)
    first = _first_diff(pairs["output_ids_rel"], pairs["output_ids_ref"])
    first = pl.Series("first_pos", first).replace(-1, None)
    return pairs.select(
        *by,
        "item_id",
        "sample",
        (pl.col("output_sha256_rel") != pl.col("output_sha256_ref")).alias("diverged"),
        first.cast(pl.Int64),
        pl.col("output_ids_ref").list.len().alias("n_tokens"),
        *[f"{c}{side}" for c in keep for side in ("_rel", "_ref")],
    )


def hash_divergence(
    requests: Frame,
    reference: Frame,
    *,
    by: Sequence[str] = ("task",),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Share of requests whose output differs from the reference run's (THEORY §3).

    ``rate = n_diverged / n`` over paired requests. With one sample per item the requests
    are independent and the interval is Wilson's score interval (Wilson 1927; statsmodels
    ``proportion_confint(method="wilson")``). With several samples of an item (a group
    where some item has more than one paired request) the samples share the item's
    prompt, so they diverge together: the item is the cluster and the interval is the
    clustered share of :func:`~relaxspec_audit.audit.intervals.clustered_share` over
    per-item counts (Korn–Graubard with the variance's degrees of freedom). Also the
    distribution of the first divergent position over diverged requests.

    Returns:
        Columns ``*by, n, n_diverged, rate, ci_low, ci_high, n_items, first_pos_mean,
        first_pos_q25, first_pos_median, first_pos_q75``.
    """
    from statsmodels.stats.proportion import proportion_confint

    by = list(by)
    per = first_divergence(requests, reference, by=by)
    keys = by or [pl.lit(0).alias("_all")]
    agg = per.group_by(keys, maintain_order=True).agg(
        pl.len().alias("n"),
        pl.col("diverged").sum().alias("n_diverged"),
        pl.col("item_id").n_unique().alias("n_items"),
        pl.col("first_pos").mean().alias("first_pos_mean"),
        pl.col("first_pos").quantile(0.25).alias("first_pos_q25"),
        pl.col("first_pos").median().alias("first_pos_median"),
        pl.col("first_pos").quantile(0.75).alias("first_pos_q75"),
    )
    lo, hi = proportion_confint(
        agg["n_diverged"].to_numpy(), agg["n"].to_numpy(), alpha=alpha, method="wilson"
    )
    lo, hi = np.atleast_1d(lo).astype(float), np.atleast_1d(hi).astype(float)
    several = (agg["n"] > agg["n_items"]).to_numpy()
    if several.any():
        # Samples nested in items: the item is the unit of the interval.
        items = per.group_by([*by, "item_id"]).agg(
            pl.col("diverged").sum().cast(pl.Float64).alias("_y"),
            pl.len().cast(pl.Float64).alias("_n"),
        )
        cs = clustered_share(items, "_y", "_n", by=by, alpha=alpha)
        cs = agg.select(by).join(cs, on=by, how="left", maintain_order="left") if by else cs
        lo = np.where(several, cs["ci_low"].to_numpy(), lo)
        hi = np.where(several, cs["ci_high"].to_numpy(), hi)
    agg = agg.with_columns(
        (pl.col("n_diverged") / pl.col("n")).alias("rate"),
        pl.Series("ci_low", lo),
        pl.Series("ci_high", hi),
    )
    return agg.select(
        *by,
        "n",
        pl.col("n_diverged").cast(pl.Int64),
        "rate",
        "ci_low",
        "ci_high",
        pl.col("n_items").cast(pl.Int64),
        "first_pos_mean",
        "first_pos_q25",
        "first_pos_median",
        "first_pos_q75",
    )


# ----------------------------------------------------------------------------------------
# Deviation accounting (THEORY §2.3, §3)
# ----------------------------------------------------------------------------------------


def flatten_es(positions: Frame, n: int) -> pl.LazyFrame:
    """Replace the ``es`` list column by flat columns ``_es0 … _es{n−1}``.

    Getting one element of a list column is a gather over 10M lists; unnesting the list
    once and reading flat columns afterwards is several times faster when many
    statistics use ``E_S`` (``audit_summary`` does this once). Every function here that
    needs ``E_S`` accepts either form.
    """
    lf = _lazy(positions, "positions", ["es"])
    names = [f"_es{j}" for j in range(n)]
    return lf.with_columns(
        pl.col("es").list.to_array(n).arr.to_struct(fields=names).struct.unnest()
    ).drop("es")


def _es_expr(lf: pl.LazyFrame, j: int) -> pl.Expr:
    """``E_S`` at grid index ``j`` as float64, from flat ``_es{j}`` or the ``es`` list."""
    names = lf.collect_schema().names()
    if f"_es{j}" in names:
        return pl.col(f"_es{j}").cast(pl.Float64)
    if "es" in names:
        return pl.col("es").list.get(j, null_on_oob=True).cast(pl.Float64)
    raise ValueError(f"positions: missing column 'es' (E_S per θ of the run's grid), have {names}")


def es_index(theta: float, grid: Sequence[float]) -> int:
    """Index of ``theta`` in the run's ``es`` grid (manifest ``config.theta_grid``).

    Raises:
        ValueError: ``theta`` is not on the grid (within 1e-6).
    """
    for i, t in enumerate(grid):
        if abs(float(t) - float(theta)) < 1e-6:
            return i
    raise ValueError(f"theta: {theta} is not on the run's es grid {list(grid)}")


def deviation_per_request(
    positions: Frame, es_idx: int, *, cluster: str = CLUSTER, by: Sequence[str] = ()
) -> pl.DataFrame:
    """Per request: the per-step deviations ``E_S`` at the run's θ and their summaries.

    Over the reached draft positions (each emitted token except a bonus comes from one
    such decision): ``eps_mean = mean E_S`` (ε of the request), ``eps_max``, ``steps``
    (number of decisions T), ``log_bound = Σ log(1 − E_S)`` so that
    ``exp(log_bound) = Π_t (1 − ε_t)`` is the coupling lower bound on producing the
    exact run's output, and ``bound_mean = (1 − eps_mean)^T`` (THEORY §2.3, as printed).

    Returns:
        Columns ``*by, request_id, steps, eps_mean, eps_max, bound_product, bound_mean``.
    """
    by = list(by)
    lf = _draft_rows(_lazy(positions, "positions", [cluster, "kind", "cause", *by]), "reached")
    es = _es_expr(lf, es_idx)
    out = (
        lf.group_by([*by, cluster])
        .agg(
            pl.len().alias("steps"),
            es.mean().alias("eps_mean"),
            es.max().alias("eps_max"),
            (1 - es).clip(1e-300, 1.0).log().sum().alias("_lb"),
        )
        .collect()
    )
    return out.with_columns(
        pl.col("_lb").exp().alias("bound_product"),
        ((1 - pl.col("eps_mean")) ** pl.col("steps")).alias("bound_mean"),
    ).drop("_lb")


def deviation_by_position(
    positions: Frame,
    es_idx: int,
    *,
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Mean per-position ``E_S`` at the run's θ by position in the block (THEORY §2.3).

    Over reached draft positions: ``E_S`` is the TV distance between NSD's output
    distribution and ``p`` at that position (``TV(P, p) = E_S``); its mean at each
    ``pos`` is a clustered ratio of sums (:func:`clustered_ratio`).

    Returns:
        Columns ``*by, pos, es_mean, ci_low, ci_high, n_positions``.
    """
    by = list(by)
    lf = _draft_rows(
        _lazy(positions, "positions", [cluster, "kind", "cause", "pos", *by]), "reached"
    )
    pc = (
        lf.group_by([*by, "pos", cluster])
        .agg(_es_expr(lf, es_idx).sum().alias("_es"), pl.len().cast(pl.Float64).alias("_n"))
        .collect()
    )
    res = clustered_ratio(pc, "_es", "_n", by=[*by, "pos"], alpha=alpha)
    return res.select(
        *by,
        "pos",
        pl.col("estimate").alias("es_mean"),
        "ci_low",
        "ci_high",
        pl.col("n").cast(pl.Int64).alias("n_positions"),
    ).sort([*by, "pos"])


def deviation_accounting(
    positions: Frame,
    es_idx: int,
    *,
    requests: Frame | None = None,
    reference: Frame | None = None,
    by: Sequence[str] = (),
    alpha: float = 0.05,
    divergence: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """ε per request and the ``(1 − ε)^T`` bound vs the identical-output rate (THEORY §2.3).

    Under coupled randomness (THEORY §4) an NSD run reproduces the ``exact`` run's output
    with probability ``≥ Π_t (1 − ε_t) ≥ (1 − max ε)^T``. The measured identical-output
    rate is ``1 − hash divergence`` against the reference ``exact`` run, with its
    interval (:func:`hash_divergence`: Wilson over requests, clustered by item when an
    item has several samples). The bound "holds" when the interval's upper end is at
    least the mean bound.

    Args:
        positions: the relaxed run's ``positions`` (``es`` list column).
        es_idx: index of the run's θ in its ``es`` grid (:func:`es_index`).
        requests: the relaxed run's ``requests`` (for the identical-output rate).
        reference: the reference ``exact`` run's ``requests``.
        by: grouping columns of ``positions`` (and of ``requests``/``reference``).
        alpha: 1 − confidence level.
        divergence: a :func:`hash_divergence` result (same ``by``) to reuse instead of
            ``requests``/``reference``.

    Returns:
        One row per group: ``n_requests, eps_mean, eps_max, steps_mean, bound_product,
        bound_mean, identical_rate, ci_low, ci_high, bound_holds`` (the last four null
        without a reference).
    """
    by = list(by)
    per = deviation_per_request(positions, es_idx, by=by)
    keys = by or [pl.lit(0).alias("_all")]
    out = per.group_by(keys, maintain_order=True).agg(
        pl.len().alias("n_requests"),
        pl.col("eps_mean").mean(),
        pl.col("eps_max").max(),
        pl.col("steps").mean().alias("steps_mean"),
        pl.col("bound_product").mean(),
        pl.col("bound_mean").mean(),
    )
    if divergence is None and requests is not None and reference is not None:
        divergence = hash_divergence(requests, reference, by=by, alpha=alpha)
    if divergence is not None:
        hd = divergence.select(
            *by,
            (1 - pl.col("rate")).alias("identical_rate"),
            (1 - pl.col("ci_high")).alias("ci_low"),
            (1 - pl.col("ci_low")).alias("ci_high"),
        )
        out = out.join(hd, on=by, how="left") if by else pl.concat([out, hd], how="horizontal")
        out = out.with_columns((pl.col("ci_high") >= pl.col("bound_product")).alias("bound_holds"))
    else:
        out = out.with_columns(
            pl.lit(None, pl.Float64).alias(c) for c in ("identical_rate", "ci_low", "ci_high")
        ).with_columns(pl.lit(None, pl.Boolean).alias("bound_holds"))
    return out.drop("_all", strict=False)
