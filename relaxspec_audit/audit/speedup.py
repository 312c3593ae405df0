"""Speed of a run (THEORY §1, §3 "Speed"): τ, acceptance, modelled and paired speed-ups.

THEORY §1 (``E[τ] = (1 − α^{K+1}) / (1 − α)`` for i.i.d. acceptance α) and THEORY §3
"Speed": the measured τ and acceptance with intervals clustered by request (CR1; Cameron &
Miller 2015), acceptance by position in the block, and speed-ups of a run over another on
the same items with an item-jackknife interval (Wolter 2007, §4.2).

Two measures of speed, never mixed (docs/STATISTICS.md §7):

- **modelled** (:func:`modelled_speedup_paired`, :func:`modelled_cost_per_token`): integer
  counts per request from the logs (draft steps, verify passes, target steps) times ONE
  cost table (:class:`~relaxspec_audit.collect.costs.CostTable`). Identical logs give
  exactly 1.0, CI [1, 1]; machine load during the collection cannot move it. This is the
  one that ranks and decides.
- **wall clock** (:func:`paired_speedup` from the collection's ``wall_s``; the paired
  timing pass of :mod:`relaxspec_audit.audit.walltime`): measured seconds, labelled.

Only numpy, polars and scipy are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import CLUSTER, Frame, _draft_rows, _lazy
from relaxspec_audit.audit.intervals import clustered_ratio, clustered_share
from relaxspec_audit.audit.pairing import pair_requests
from relaxspec_audit.collect.costs import CostTable, CostTableError, flagged_note, preferred
from relaxspec_audit.collect.manifest import RunManifest

# One E[τ] and one speed formula in the package: theory's (THEORY §1), re-exported here.
from relaxspec_audit.verify.theory import expected_tokens_per_pass as expected_tau
from relaxspec_audit.verify.theory import modelled_speedup as modelled_speedup

# ----------------------------------------------------------------------------------------
# Speed (THEORY §1, §3 "Speed")
# ----------------------------------------------------------------------------------------


def acceptance_by_position(
    positions: Frame, *, by: Sequence[str] = (), cluster: str = CLUSTER, alpha: float = 0.05
) -> pl.DataFrame:
    """Acceptance rate per position in the block.

    ``accept_rate`` at position ``i`` is the share of rounds whose draft ``i`` was
    accepted (``not_reached`` counts as not accepted), with the Korn–Graubard interval
    of a clustered share (:func:`~relaxspec_audit.audit.intervals.clustered_share`);
    ``accept_rate_given_reached`` divides by the rounds that reached ``i``.

    Returns:
        Columns ``*by, pos, accept_rate, ci_low, ci_high, accept_rate_given_reached,
        n_rounds``.
    """
    by = list(by)
    need = [cluster, "kind", "cause", "pos", "accepted", *by]
    lf = _draft_rows(_lazy(positions, "positions", need), "all")
    pc = (
        lf.group_by([*by, "pos", cluster])
        .agg(
            pl.col("accepted").sum().cast(pl.Float64).alias("_acc"),
            pl.len().cast(pl.Float64).alias("_n"),
            (pl.col("cause") != "not_reached").sum().cast(pl.Float64).alias("_reached"),
        )
        .collect()
    )
    # A share: Korn–Graubard's interval holds near 0 and 1, where positions late in the
    # block sit (the clipped CR1 Wald interval collapses there).
    res = clustered_share(pc, "_acc", "_n", by=[*by, "pos"], alpha=alpha)
    reached = pc.group_by([*by, "pos"]).agg(
        (pl.col("_acc").sum() / pl.col("_reached").sum()).alias("accept_rate_given_reached")
    )
    return (
        res.join(reached, on=[*by, "pos"], how="left")
        .select(
            *by,
            "pos",
            pl.col("estimate").alias("accept_rate"),
            pl.col("ci_low").clip(0.0, 1.0),
            pl.col("ci_high").clip(0.0, 1.0),
            "accept_rate_given_reached",
            pl.col("n").cast(pl.Int64).alias("n_rounds"),
        )
        .sort([*by, "pos"])
    )


def _paired_ratio_ci(
    a_num: np.ndarray,
    a_den: np.ndarray,
    b_num: np.ndarray,
    b_den: np.ndarray,
    alpha: float,
    item: np.ndarray | pl.Series,
) -> tuple[float, float, float]:
    """``S = (ΣA/ΣB)/(ΣC/ΣD)`` over paired requests, with an item-jackknife CI on ``log S``.

    The samples of one item share its prompt and difficulty, so the item is the unit:
    per item ``g`` the four totals are summed over its requests, and the variance of
    ``log S`` is the delete-one-item jackknife (Quenouille 1956; Tukey 1958; for a ratio
    of totals, Wolter 2007, *Introduction to Variance Estimation*, §4.2)::

        ℓ_(g)   = log S computed without item g
        Var     = (G − 1)/G · Σ_g (ℓ_(g) − ℓ̄)²,    CI = S·exp(±t_{1−α/2, G−1}·√Var)

    It is the linearised (delta-method, Cochran 1977 §6.4) variance to first order, and
    holds its coverage better at 10–20 items (0.92–0.94 where the linearised one gives
    0.91–0.93; ``benchmarks/bench_coverage.py``). With one sample per item the item is
    the request. Two identical runs give ``ℓ_(g) = 0`` bit for bit (the same sums on both
    sides), hence ``S = 1`` with CI ``[1, 1]``.

    Args:
        a_num: the reference side's numerator per request (time), ``[n]``.
        a_den: the reference side's denominator per request (tokens).
        b_num: the candidate side's numerator.
        b_den: the candidate side's denominator.
        alpha: 1 − confidence level.
        item: the item of each request (the cluster), ``[n]``.
    """
    from scipy import stats as sps

    cluster = pl.Series(item).cast(pl.String).rank("dense").to_numpy().astype(np.int64) - 1
    g = int(cluster.max()) + 1 if len(cluster) else 0
    per = [np.bincount(cluster, weights=x, minlength=g) for x in (a_num, a_den, b_num, b_den)]
    sums = [float(x.sum()) for x in per]
    est = (sums[0] / sums[1]) / (sums[2] / sums[3])
    if g < 2:
        return float(est), float("nan"), float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        rest = [s_ - x for s_, x in zip(sums, per, strict=True)]  # totals without item g
        loo = np.log((rest[0] / rest[1]) / (rest[2] / rest[3]))  # [G]
    if not np.all(np.isfinite(loo)):
        return float(est), float("nan"), float("nan")
    se = math.sqrt((g - 1) / g * float(np.sum((loo - loo.mean()) ** 2)))
    tq = sps.t.ppf(1 - alpha / 2, g - 1)
    return float(est), float(est * math.exp(-tq * se)), float(est * math.exp(tq * se))


def paired_speedup(
    requests: Frame,
    baseline: Frame,
    *,
    by: Sequence[str] = ("task",),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """WALL-CLOCK speed-up of a run over a baseline on the same items, from the collection.

    ``speedup = (Σ wall_base / Σ tokens_base) / (Σ wall_rel / Σ tokens_rel)`` — the ratio
    of seconds per token — with an interval on ``log speedup`` from the delete-one-item
    jackknife (:func:`_paired_ratio_ci`): items are the units, samples nested in them.

    This is the NOISY measure: the two runs were collected at different times, so load on
    the machine between them moves it (two runs with identical outputs have shown 0.54×),
    and its interval holds only the item-to-item spread, not that run-to-run noise. Decide
    with :func:`modelled_speedup_paired`; for a wall clock that includes run-to-run noise,
    use the paired timing pass (``relaxspec-audit time``, :mod:`~.walltime`).

    Returns:
        Columns ``*by, n_pairs, speedup, ci_low, ci_high``.
    """
    by = list(by)
    pairs = pair_requests(requests, baseline, ["wall_s", "n_tokens"], by=by)
    rows = []
    groups = pairs.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pairs}
    for key, part in groups.items():
        f = [part[c].cast(pl.Float64).to_numpy() for c in ("wall_s_ref", "n_tokens_ref")]
        g = [part[c].cast(pl.Float64).to_numpy() for c in ("wall_s_rel", "n_tokens_rel")]
        est, lo, hi = _paired_ratio_ci(*f, *g, alpha, part["item_id"])
        row = dict(zip(by, key, strict=True))
        row.update(n_pairs=part.height, speedup=est, ci_low=lo, ci_high=hi)
        rows.append(row)
    return pl.DataFrame(rows)


# ----------------------------------------------------------------------------------------
# Modelled speed: integer counts × one cost table (docs/STATISTICS.md §7)
# ----------------------------------------------------------------------------------------


def _cost_table(value: Any, name: str) -> CostTable | None:
    """A :class:`CostTable` from a table, its dict, a run's manifest, or None."""
    if value is None or isinstance(value, CostTable):
        return value
    if isinstance(value, RunManifest):
        return value.cost_table
    if isinstance(value, Mapping):
        try:
            return CostTable.from_dict(value)
        except CostTableError as exc:
            raise ValueError(f"{name}: {exc}") from exc
    raise TypeError(f"{name}: expected a CostTable, a mapping or None, got {type(value)}")


def _run_shape(manifest: RunManifest, name: str) -> tuple[bool, int, bool]:
    """``(target_only, K, static engine)`` of a run from its manifest."""
    if not isinstance(manifest, RunManifest):
        raise TypeError(f"{name}: expected a RunManifest, got {type(manifest).__name__}")
    target_only = manifest.spec is None
    k = 0 if target_only else manifest.config.k
    return target_only, k, manifest.engine.get("engine") != "generic"


def _request_costs(
    rounds: Frame | None,
    requests: Frame,
    manifest: RunManifest,
    table: CostTable,
    by: Sequence[str],
    name: str,
) -> pl.DataFrame:
    """Per request: ``*by, item_id, request_id, run_id?, n_tokens, _cost`` (modelled seconds).

    Counts (docs/STATISTICS.md §7): a target-only run's rounds are its target steps
    (one per token); a speculative round is one verify pass and K draft steps, the K of the
    manifest (the batched engine drafts K for every row whatever the row's block length;
    the one-request ``generic`` engine stops at a draft EOS, so its draft steps are
    ``Σ k``). Without ``rounds`` the count of rounds is ``target_passes``.
    """
    target_only, k, static = _run_shape(manifest, name)
    keys = ["run_id", "request_id"]
    rq = _lazy(requests, f"{name} requests", ["request_id", "item_id", "n_tokens", *by])
    have = rq.collect_schema().names()
    keys = [c for c in keys if c in have]
    if rounds is None:
        rq = _lazy(requests, f"{name} requests", ["target_passes"])
        per = rq.select(
            *keys,
            pl.col("target_passes").cast(pl.Float64).alias("_rounds"),
            (pl.col("target_passes").cast(pl.Float64) * k).alias("_k"),
        )
    else:
        rd = _lazy(rounds, f"{name} rounds", ["request_id", "k"])
        rkeys = [c for c in keys if c in rd.collect_schema().names()]
        per = rd.group_by(rkeys).agg(
            pl.len().cast(pl.Float64).alias("_rounds"),
            pl.col("k").sum().cast(pl.Float64).alias("_k"),
        )
        keys = rkeys
    df = (
        rq.select(*dict.fromkeys([*keys, *by, "item_id", "n_tokens"]))
        .join(per, on=keys, how="left")
        .collect()
    )
    if df["_rounds"].null_count():
        missing = df.filter(pl.col("_rounds").is_null())["request_id"].head(3).to_list()
        raise ValueError(f"{name}: request(s) {missing} have no rounds")
    if target_only:
        cost = pl.col("_rounds") * table.target_step_s
    else:
        for field_ in ("draft_step_s", "verify_s"):
            if getattr(table, field_) is None:
                raise ValueError(f"{name}: cost table {table.id} has no {field_!r} (no draft "
                                 "or K = 0) but the run is speculative")  # fmt: skip
        steps = pl.col("_rounds") * k if static else pl.col("_k")
        cost = steps * table.draft_step_s + pl.col("_rounds") * table.verify_s
    return df.with_columns(cost.alias("_cost"))


def _table_note(ref: CostTable, rel: CostTable) -> str | None:
    """None when one table prices both runs; else what differs between the two."""
    if ref.id == rel.id:
        return None
    a, b = ref.key(), rel.key()
    what = "; ".join(f"{f} {_short(a[f])} vs {_short(b[f])}" for f in a if a[f] != b[f])
    return (
        f"different cost tables (reference {ref.id} vs candidate {rel.id}: {what}); each "
        "run's counts are costed with its own table, so the ratio mixes two calibrations"
    )


def _short(value: Any) -> str:
    if isinstance(value, Mapping):
        return str(value.get("model_type")) + "/" + str(value.get("n_params"))
    return str(value)


def modelled_speedup_paired(
    rel_rounds: Frame | None,
    rel_requests: Frame,
    rel_manifest: RunManifest,
    ref_rounds: Frame | None,
    ref_requests: Frame,
    ref_manifest: RunManifest,
    *,
    by: Sequence[str] = (),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """MODELLED speed-up of a run A over a reference R on the same items (STATISTICS §7).

    Per request ``cost_i = draft_steps_i·draft_step_s + verify_passes_i·verify_s +
    target_steps_i·target_step_s`` from the run's integer counts (a speculative run:
    ``draft_steps = K·rounds``, ``verify_passes = rounds``; target-only: ``target_steps =
    rounds = tokens``) and the per-step seconds of its cost table
    (``manifest["cost_table"]``). Paired by item::

        S = (Σ cost_R / Σ tok_R) / (Σ cost_A / Σ tok_A)

    with the item-jackknife interval on ``log S`` (:func:`_paired_ratio_ci`: items are the
    units, their samples nested in them). Identical logs and one table give exactly 1.0, CI [1, 1];
    two speculative runs sharing K and a table give ``τ_A / τ_R`` (the cost of a round
    cancels). Prefill is not counted (the same prompts in both runs).

    Args:
        rel_rounds: the candidate run's ``rounds`` (None: ``target_passes`` of its
            requests counts the rounds).
        rel_requests: the candidate run's ``requests``.
        rel_manifest: the candidate run's manifest (``config``, ``engine``, ``cost_table``).
        ref_rounds: the reference run's ``rounds`` (None as for ``rel_rounds``).
        ref_requests: the reference run's ``requests``.
        ref_manifest: the reference run's manifest.
        by: grouping columns present in both requests tables.
        alpha: 1 − confidence level.

    Returns:
        Columns ``*by, n_pairs, speedup, ci_low, ci_high, cost_table, note``: ``cost_table``
        is the table id (both ids when they differ); ``note`` is null when one table prices
        both runs (two calibrations of one key are priced with :func:`~relaxspec_audit.
        collect.costs.preferred`), says what differs when the tables measured different
        things (still computed), says when a table is flagged (``CostTable.warnings``), and
        says which run lacks one when either does (then ``speedup`` and its CI are null).
    """
    by = list(by)
    t_rel = _cost_table(rel_manifest, "rel_manifest")
    t_ref = _cost_table(ref_manifest, "ref_manifest")
    if t_rel is None or t_ref is None:
        who = " and ".join(n for n, t in (("reference", t_ref), ("candidate", t_rel)) if t is None)
        note = f"no cost table in the {who} run's manifest: no modelled speed-up"
        keys = pair_requests(rel_requests, ref_requests, ["n_tokens"], by=by)
        if by:
            groups = keys.group_by(by, maintain_order=True).len()
        else:
            groups = pl.DataFrame({"len": [keys.height]})
        nulls = [pl.lit(None, pl.Float64).alias(c) for c in ("speedup", "ci_low", "ci_high")]
        return groups.select(
            *by,
            pl.col("len").cast(pl.Int64).alias("n_pairs"),
            *nulls,
            pl.lit(None, pl.String).alias("cost_table"),
            pl.lit(note).alias("note"),
        )
    if t_rel.id != t_ref.id and t_rel.key() == t_ref.key():
        # Two calibrations of one key: one prices both, so a load during either cannot
        # move the comparison and identical logs give exactly 1.0.
        t_rel = t_ref = preferred([t_ref, t_rel])
    rel = _request_costs(rel_rounds, rel_requests, rel_manifest, t_rel, by, "rel")
    ref = _request_costs(ref_rounds, ref_requests, ref_manifest, t_ref, by, "ref")
    note = _table_note(t_ref, t_rel)
    table_id = t_rel.id if note is None else f"{t_ref.id}/{t_rel.id}"
    flagged = flagged_note([*t_ref.warnings, *t_rel.warnings])
    note = "; ".join(n for n in (note, flagged) if n) or None
    pairs = pair_requests(rel, ref, ["_cost", "n_tokens"], by=by)
    rows = []
    groups = pairs.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pairs}
    for key, part in groups.items():
        f = [part[c].cast(pl.Float64).to_numpy() for c in ("_cost_ref", "n_tokens_ref")]
        g = [part[c].cast(pl.Float64).to_numpy() for c in ("_cost_rel", "n_tokens_rel")]
        est, lo, hi = _paired_ratio_ci(*f, *g, alpha, part["item_id"])
        row = dict(zip(by, key, strict=True))
        row.update(n_pairs=part.height, speedup=est, ci_low=lo, ci_high=hi,
                   cost_table=table_id, note=note)  # fmt: skip
        rows.append(row)
    return pl.DataFrame(rows, schema_overrides={"note": pl.String})


def modelled_cost_per_token(
    rounds: Frame | None,
    requests: Frame,
    manifest: RunManifest,
    *,
    by: Sequence[str] = (),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Modelled seconds per emitted token of one run: ``Σ cost_i / Σ tok_i`` (STATISTICS §7).

    ``cost_i`` as in :func:`modelled_speedup_paired`; the interval is the request-clustered
    CR1 interval of a ratio of sums (:func:`~relaxspec_audit.audit.intervals.clustered_ratio`).

    Returns:
        Columns ``*by, n_requests, cost_per_token_s, ci_low, ci_high, cost_table, note``
        (``note``: null unless the table is flagged).
    """
    by = list(by)
    table = _cost_table(manifest, "manifest")
    if table is None:
        raise ValueError("manifest: no field 'cost_table' (no modelled cost without one)")
    per = _request_costs(rounds, requests, manifest, table, by, "run")
    per = per.with_columns(pl.col("n_tokens").cast(pl.Float64))
    res = clustered_ratio(per, "_cost", "n_tokens", by=by, alpha=alpha)
    return res.select(
        *by,
        pl.col("n_clusters").cast(pl.Int64).alias("n_requests"),
        pl.col("estimate").alias("cost_per_token_s"),
        "ci_low",
        "ci_high",
        pl.lit(table.id).alias("cost_table"),
        pl.lit(flagged_note(table.warnings), pl.String).alias("note"),
    )


def speed(
    rounds: Frame,
    requests: Frame | None = None,
    *,
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
    alpha: float = 0.05,
    cost_table: CostTable | Mapping[str, Any] | None = None,
) -> pl.DataFrame:
    """Speed of one or more runs (THEORY §1, §3 "Speed"; docs/STATISTICS.md §7).

    From the log counts: ``tau_mean = Σ emitted / #rounds`` (clustered CI, CR1);
    acceptance ``alpha = Σ accepted / Σ reached`` with ``reached = min(accepted + 1, k)``
    (per-position acceptance under the i.i.d. model); ``k_mean``; ``modelled_tau =
    E[τ](alpha, k_mean)`` (THEORY §1).

    MODELLED, from the counts and a cost table (only with ``cost_table``; null without
    one): ``modelled_cost_per_token = Σ cost / Σ emitted`` with a round's cost
    ``K·draft_step_s + verify_s`` (``K`` the table's: the batched engine drafts K per
    round) and a target-only row's (``k = 0``) ``target_step_s``; ``modelled_speedup =
    target_step_s / modelled_cost_per_token``, the speed-up over target-only decoding of
    the same tokens (THEORY §1's ``E[τ]/(1 + K·c)`` with measured τ and a K+1-token verify
    pass costed as measured). It replaced ``E[τ]/(1 + K·c)`` with ``c`` from each run's
    own timings, which moved with machine load.

    WALL-CLOCK MEASURED diagnostics (from the collection's timings, noisy, never used to
    decide): ``verify_share = Σ verify_s / Σ(draft_s + verify_s)`` and ``c = (Σ draft_s /
    Σ k) / (Σ verify_s / #rounds)`` (one draft forward vs one verify pass). From
    ``requests`` (if given): ``passes_per_token = Σ target_passes / Σ n_tokens`` (counts)
    and ``tokens_per_s = Σ n_tokens / Σ wall_s`` (wall clock).

    Args:
        rounds: the ``rounds`` table of one or more runs.
        requests: their ``requests`` table (optional).
        by: grouping columns.
        cluster: the cluster key (the request).
        alpha: 1 − confidence level.
        cost_table: the runs' :class:`~relaxspec_audit.collect.costs.CostTable` (or its
            dict, or a manifest holding one); None leaves the modelled columns null.

    Returns:
        One row per group with the columns named above, ``tau_ci_low``, ``tau_ci_high``,
        ``cost_note`` (null unless the table is flagged), ``n_rounds``, ``n_requests``.

    Raises:
        ValueError: a cost table whose K is smaller than the rounds' ``k``, or that lacks
            the draft or verify cost a speculative round needs.
    """
    by = list(by)
    need = [cluster, "k", "accepted", "emitted", "draft_s", "verify_s", *by]
    lf = _lazy(rounds, "rounds", need)
    reached = pl.min_horizontal(pl.col("accepted") + 1, pl.col("k"))
    pc = (
        lf.group_by([*by, cluster])
        .agg(
            pl.col("emitted").sum().cast(pl.Float64).alias("_emit"),
            pl.len().cast(pl.Float64).alias("_rounds"),
            pl.col("accepted").sum().cast(pl.Float64).alias("_acc"),
            reached.sum().cast(pl.Float64).alias("_reached"),
            pl.col("k").sum().cast(pl.Float64).alias("_k"),
            pl.col("draft_s").sum().alias("_draft"),
            pl.col("verify_s").sum().alias("_verify"),
            (pl.col("k") == 0).sum().cast(pl.Float64).alias("_steps"),
            pl.col("k").max().alias("_kmax"),
        )
        .collect()
    )
    table = _cost_table(cost_table, "cost_table")
    if table is not None:
        pc = pc.with_columns(_round_costs(pc, table).alias("_cost"))
    else:
        pc = pc.with_columns(pl.lit(None, pl.Float64).alias("_cost"))
    tau = clustered_ratio(pc, "_emit", "_rounds", by=by, alpha=alpha)
    keys = by or [pl.lit(0).alias("_all")]
    tot = pc.group_by(keys, maintain_order=True).agg(pl.all().exclude(cluster, *by).sum(),
                                                     pl.len().alias("n_requests"))  # fmt: skip
    tot = tot.with_columns(
        (pl.col("_acc") / pl.col("_reached")).alias("alpha"),
        (pl.col("_k") / pl.col("_rounds")).alias("k_mean"),
        (pl.col("_verify") / (pl.col("_draft") + pl.col("_verify"))).alias("verify_share"),
        ((pl.col("_draft") / pl.col("_k")) / (pl.col("_verify") / pl.col("_rounds"))).alias("c"),
    )
    mt = expected_tau(tot["alpha"].to_numpy(), tot["k_mean"].to_numpy())
    # A sum of nulls is 0 in polars: no table gives null, never a zero cost.
    per_token = pl.lit(None, pl.Float64) if table is None else pl.col("_cost") / pl.col("_emit")
    target_step = None if table is None else table.target_step_s
    tot = tot.with_columns(
        pl.Series("modelled_tau", mt),
        per_token.alias("modelled_cost_per_token"),
        (pl.lit(target_step, pl.Float64) / per_token).alias("modelled_speedup"),
    )
    if by:
        out = tau.join(tot, on=by, how="left")
    else:
        out = pl.concat([tau, tot.drop("_all")], how="horizontal")
    out = out.select(
        *by,
        pl.col("estimate").alias("tau_mean"),
        pl.col("ci_low").alias("tau_ci_low"),
        pl.col("ci_high").alias("tau_ci_high"),
        "alpha",
        "k_mean",
        "verify_share",
        "c",
        "modelled_tau",
        "modelled_cost_per_token",
        "modelled_speedup",
        pl.lit(None if table is None else flagged_note(table.warnings), pl.String).alias(
            "cost_note"
        ),
        pl.col("_rounds").cast(pl.Int64).alias("n_rounds"),
        "n_requests",
    )
    if requests is not None:
        need_r = ["n_tokens", "target_passes", "wall_s", *by]
        rq = _lazy(requests, "requests", need_r)
        per = rq.group_by(by or pl.lit(0).alias("_all")).agg(
            (pl.col("target_passes").sum() / pl.col("n_tokens").sum()).alias("passes_per_token"),
            (pl.col("n_tokens").sum() / pl.col("wall_s").sum()).alias("tokens_per_s"),
        )
        per = per.collect()
        out = (
            out.join(per, on=by, how="left")
            if by
            else pl.concat([out, per.drop("_all")], how="horizontal")
        )
    return out


def _round_costs(pc: pl.DataFrame, table: CostTable) -> pl.Expr:
    """Modelled seconds per (group, request): K·draft + verify per round, a step per token."""
    k_max = pc["_kmax"].max()
    spec = pc["_rounds"] - pc["_steps"]
    if spec.sum() > 0:
        if table.draft_step_s is None or table.verify_s is None:
            raise ValueError(f"cost_table: {table.id} has no draft or verify cost (K = "
                             f"{table.k}) but the rounds are speculative")  # fmt: skip
        if k_max is not None and k_max > table.k:
            raise ValueError(f"cost_table: K = {table.k} but the rounds draft up to {k_max}")
    per_round = table.k * (table.draft_step_s or 0.0) + (table.verify_s or 0.0)
    spec_rounds = pl.col("_rounds") - pl.col("_steps")
    return spec_rounds * per_round + pl.col("_steps") * table.target_step_s
