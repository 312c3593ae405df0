"""Counterfactual NSD sweep: NSD at every θ replayed from ONE ``exact`` run (first-order).

Every draft position of a block is logged with ``passed_ratio`` and ``mass_above`` from
the same target pass, so NSD's decision at any θ (THEORY §2.3: accept iff the ratio test
passed or ``mass_above < θ``) can be replayed block by block without a new run. The
replay is first-order: NSD would have emitted different tokens after its first extra
acceptance, so later blocks differ in a real NSD run (columns are suffixed ``_fo``).

Only numpy and polars are imported: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from relaxspec_audit.audit.anatomy import DEFAULT_THETA_GRID
from relaxspec_audit.audit.fidelity import _es_expr, es_index
from relaxspec_audit.audit.frames import CLUSTER, Frame, _lazy
from relaxspec_audit.audit.speedup import expected_tau


def _blocks_contiguous(lf: pl.LazyFrame, win: list[str]) -> bool:
    """True when draft rows come block by block, positions 0, 1, … in order."""
    same = pl.all_horizontal([pl.col(c) == pl.col(c).shift(1) for c in win])
    ok = (pl.col("pos") == 0) | (same & (pl.col("pos") == pl.col("pos").shift(1) + 1))
    return bool(lf.select(ok.all()).collect().item())


def counterfactual_nsd(
    positions: Frame,
    thetas: Sequence[float] = DEFAULT_THETA_GRID,
    *,
    es_grid: Sequence[float] | None = None,
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
) -> pl.DataFrame:
    """First-order effect of NSD at each θ, replayed from ONE ``exact`` run's blocks.

    Every draft position of the block is logged, including ``not_reached`` ones, with
    its ``u``, ``passed_ratio`` and ``mass_above`` from the same target pass. NSD at θ
    accepts position ``i`` iff ``passed_ratio_i ∨ mass_above_i < θ`` (THEORY §2.3) and the
    accepted length is the longest all-true prefix. Position ``i`` fails at θ iff
    ``θ ≤ t_i`` with ``t_i = mass_above_i`` if the ratio test failed, ``−∞`` otherwise;
    so ``i`` is accepted iff ``θ > m_i = max_{j ≤ i} t_j`` (one prefix-max window for all
    θ) and reached iff ``θ > max_{j < i} t_j``.

    *First-order*: each block is replayed exactly, but NSD would have emitted different
    tokens after its first extra acceptance, so later blocks (and their p, q) differ in
    a real NSD run. Columns are suffixed ``_fo`` to say so; real effects come from real
    NSD runs.

    Returns:
        Columns ``*by, theta, accept_rate_fo`` (accepted / reached positions),
        ``tau_fo`` (mean accepted length + 1 over the replayed rounds),
        ``tau_iid_fo`` (``E[τ]`` from ``accept_rate_fo`` and mean K), ``es_mean_fo``
        (mean ``E_S`` at θ over the replayed reached positions; null if θ is not on
        ``es_grid``), ``extra_accept_fo`` (share of reached positions accepted only by
        the nucleus), ``n_rounds``.
    """
    by = list(by)
    need = [cluster, "kind", "round", "pos", "passed_ratio", "mass_above", *by]
    lf = _lazy(positions, "positions", need)
    if "rule" in lf.collect_schema().names():
        rules = lf.select(pl.col("rule").unique()).collect()["rule"].to_list()
        bad = [r for r in rules if r not in ("exact", None)]
        if bad:
            raise ValueError(
                f"positions: counterfactual_nsd replays an 'exact' run, got rule(s) {bad}"
            )
    lf = lf.filter(pl.col("kind") == "draft")
    win = [*by, cluster, "round"]
    if "run_id" in lf.collect_schema().names():
        win = ["run_id", *win]
    t = (
        pl.when(pl.col("passed_ratio"))
        .then(pl.lit(-1.0))
        .otherwise(pl.col("mass_above").cast(pl.Float64))
    )
    lf = lf.with_columns(t.alias("_t"))
    # Inclusive prefix max m_i (accepted iff θ > m_i); exclusive one _mx for "reached".
    if _blocks_contiguous(lf, win):
        # Logs are written block by block, so a segmented prefix max needs no window:
        # offset each block by 3·(block index) (t ∈ [−1, 1]) so one global cum_max never
        # carries a value across blocks, then remove the offset.
        seg = (pl.col("pos") == 0).cum_sum().cast(pl.Float64) * 3.0
        lf = lf.with_columns(((pl.col("_t") + seg).cum_max() - seg).alias("_m"))
        lf = lf.with_columns(
            pl.when(pl.col("pos") == 0)
            .then(pl.lit(-1.0))
            .otherwise(pl.col("_m").shift(1))
            .alias("_mx")
        )
    else:
        lf = lf.with_columns(pl.col("_t").cum_max().over(win, order_by="pos").alias("_m"))
        lf = lf.with_columns(
            pl.col("_m").shift(1, fill_value=-1.0).over(win, order_by="pos").alias("_mx")
        )
    aggs = [pl.len().alias("_n"), (pl.col("pos") == 0).sum().alias("_rounds")]
    idx = {}
    for i, th in enumerate(thetas):
        acc = pl.col("_m") < th
        reach = pl.col("_mx") < th
        aggs += [acc.sum().alias(f"_a{i}"), reach.sum().alias(f"_r{i}")]
        aggs.append((acc & ~pl.col("passed_ratio")).sum().alias(f"_x{i}"))
        if es_grid is not None:
            try:
                j = es_index(th, es_grid)
            except ValueError:
                continue
            idx[i] = j
            es = _es_expr(lf, j)
            aggs.append(pl.when(reach).then(es).otherwise(0.0).sum().alias(f"_e{i}"))
    keys = by or [pl.lit(0).alias("_all")]
    # A plain select when there are no groups: group_by on a literal key is slower.
    tot = (lf.group_by(keys).agg(aggs) if by else lf.select(aggs)).collect()
    k_mean = tot["_n"] / tot["_rounds"]
    rows = []
    for i, th in enumerate(thetas):
        acc, reach = tot[f"_a{i}"], tot[f"_r{i}"]
        rate = (acc / reach).to_numpy()
        es_mean = (tot[f"_e{i}"] / reach).to_numpy() if i in idx else np.full(len(rate), np.nan)
        cols = {
            "theta": np.full(len(rate), float(th)),
            "accept_rate_fo": rate,
            "tau_fo": (acc / tot["_rounds"]).to_numpy() + 1.0,
            "tau_iid_fo": expected_tau(rate, k_mean.to_numpy()),
            "es_mean_fo": es_mean,
            "extra_accept_fo": (tot[f"_x{i}"] / reach).to_numpy(),
            "n_rounds": tot["_rounds"].to_numpy(),
        }
        frame = pl.concat([tot.select(by), pl.DataFrame(cols)], how="horizontal")
        rows.append(frame)
    return pl.concat(rows).sort([*by, "theta"])
