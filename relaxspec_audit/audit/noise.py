"""The noise floor: how far lossless decoding already departs through numerics alone.

A K+1-token verify pass and a one-token target step compute the same logits in a
different order, and so do batches of different sizes and different dtypes; in bf16 on a
GPU the rounding differs enough to flip a near-tie (THEORY §3 "Noise floor", §4 "Batching
caveat"). An audit that blames the relaxed rule for divergence a lossless run also shows
misleads its reader, so the floor is measured beside the rule's divergence:

* :func:`greedy_floor` — at T = 0 strict greedy speculative decoding is lossless (THEORY
  §2.2): its output is the target's greedy output token for token, so every difference
  between a ``greedy`` run and a ``target`` run on the same items is numerical;
* :func:`numeric_floor` — two runs of one reference configuration that differ only in
  batch size or dtype (or device): output divergence, decision flips where the runs are
  still aligned, and the largest float differences there;
* :func:`floor_sentence` — the floor in words, for the report (plain text; escaping is the
  report's job).

For sampling families ``exact`` and ``target`` are equal in law but not token for token
(they draw from different purposes of the stream, THEORY §4), so there the floor is read
from :func:`relaxspec_audit.audit.attribution.attribute_divergence` instead.

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from relaxspec_audit.audit.fidelity import first_divergence, hash_divergence
from relaxspec_audit.audit.frames import CLUSTER, Frame, RunFrames, _lazy

# Config fields two runs of a numeric floor may differ in: what changes the arithmetic
# (batch size, dtype, device) or only labels the replica (variant, limit).
_FLOOR_FIELDS = frozenset({"batch_size", "dtype", "device", "variant", "limit"})
# Manifest fields that describe the run's arithmetic, reported when they differ.
_ARITH_KEYS = ("engine", "models.dtype", "models.device", "host", "git_commit")


def greedy_floor(
    greedy_requests: Frame,
    target_requests: Frame,
    *,
    alpha: float = 0.05,
    by: Sequence[str] = ("task",),
) -> pl.DataFrame:
    """The greedy-family noise floor: ``greedy`` against ``target`` at T = 0 (THEORY §3).

    Strict greedy verification emits the target's argmax at every position (THEORY §2.2),
    so without numerics its output equals target-only greedy decoding's. On the paired
    items: the hash divergence rate ``n_diverged / n`` with a Wilson interval
    (:func:`hash_divergence`), the first divergent positions, and, when both runs are
    scored, the accuracy delta greedy − target (paired t on item means; Tango's interval
    for one binary score per item: :func:`relaxspec_audit.audit.accuracy.accuracy_delta`).

    Args:
        greedy_requests: the strict ``greedy`` run's ``requests`` (temperature 0).
        target_requests: the ``target`` run's ``requests`` on the same items.
        alpha: 1 − confidence level.
        by: grouping columns present in both.

    Returns:
        One row per group: ``*by, n, n_diverged, rate, ci_low, ci_high, first_pos_mean,
        first_pos_median, first_positions`` (sorted list over diverged items),
        ``acc_delta, acc_ci_low, acc_ci_high`` (null without scores).
    """
    from relaxspec_audit.audit.accuracy import accuracy_delta

    by = list(by)
    hd = hash_divergence(greedy_requests, target_requests, by=by, alpha=alpha)
    per = first_divergence(greedy_requests, target_requests, by=by)
    keys = by or [pl.lit(0).alias("_all")]
    firsts = per.group_by(keys, maintain_order=True).agg(
        pl.col("first_pos").drop_nulls().sort().alias("first_positions")
    )
    out = (
        hd.join(firsts, on=by, how="left")
        if by
        else pl.concat([hd, firsts.drop("_all")], how="horizontal")
    )
    acc_cols = ("acc_delta", "acc_ci_low", "acc_ci_high")
    try:
        acc = accuracy_delta(greedy_requests, target_requests, by=by, alpha=alpha)
    except ValueError:  # no scored pair: an open-ended task
        acc = None
    if acc is not None:
        acc = acc.select(
            *by,
            pl.col("delta").alias("acc_delta"),
            pl.col("ci_low").alias("acc_ci_low"),
            pl.col("ci_high").alias("acc_ci_high"),
        )
        out = out.join(acc, on=by, how="left") if by else pl.concat([out, acc], how="horizontal")
    else:
        out = out.with_columns(pl.lit(None, pl.Float64).alias(c) for c in acc_cols)
    return out.select(
        *by,
        "n",
        "n_diverged",
        "rate",
        "ci_low",
        "ci_high",
        "first_pos_mean",
        "first_pos_median",
        "first_positions",
        *acc_cols,
    )


def _frames(run: Any, name: str) -> RunFrames:
    """A run as :class:`RunFrames`: a folder is loaded (verified); frames pass through."""
    if isinstance(run, str | Path):
        return RunFrames.load(run)
    if isinstance(run, RunFrames):
        return run
    raise TypeError(f"{name}: expected a run folder or RunFrames, got {type(run).__name__}")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def manifest_differences(
    manifest_a: Mapping[str, Any], manifest_b: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """What differs between two runs' configurations and arithmetic, key → (a, b).

    Compares ``config`` (as ``config.<field>``), the ``engine`` block, the models'
    dtype and device, the host and the git commit: what a numeric floor should name.
    """

    def pick(m: Mapping[str, Any]) -> dict[str, Any]:
        flat = _flatten({"config": m.get("config", {})})
        full = _flatten(m)
        for key in _ARITH_KEYS:
            flat.update({k: v for k, v in full.items() if k == key or k.startswith(f"{key}.")})
        return flat

    a, b = pick(manifest_a), pick(manifest_b)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _check_same_reference(diff: Mapping[str, tuple[Any, Any]]) -> None:
    """Refuse runs whose configurations differ beyond the arithmetic (named field)."""
    for key, (a, b) in diff.items():
        if key.startswith("config.") and key.split(".", 2)[1] not in _FLOOR_FIELDS:
            raise ValueError(
                f"run_b: {key} differs ({a!r} vs {b!r}); a numeric floor compares one "
                f"configuration that differs only in {sorted(_FLOOR_FIELDS)}"
            )


def numeric_floor(run_a: Any, run_b: Any, *, alpha: float = 0.05) -> dict[str, Any]:
    """The numeric floor between two runs of one configuration (THEORY §3, §4).

    The runs share seed, rule, items and stream and differ only in batch size, dtype or
    device, so a difference between them is float arithmetic. Measured:

    * ``rate``: the share of requests whose outputs differ, ``n_diverged / n``, with a
      Wilson interval (:func:`hash_divergence`), and ``first_positions``;
    * **aligned rows**: position rows at or before the request's first divergence
      (``abs_pos ≤ first_pos``; every row when the outputs agree) that both runs computed
      in the same context — the same round start ``abs_pos − pos``, ``pos`` and ``kind``,
      and the same draft tokens before ``pos`` in that round. A row after a differing
      draft, or in a round that started elsewhere, is not comparable and is left out;
    * ``n_token_diffs``: aligned rows whose token differs (a draft or a recovery/bonus
      sample that landed elsewhere, e.g. an argmax or inverse-CDF near-tie);
    * ``flips``: aligned draft rows with the same token whose ``accepted`` or
      ``passed_ratio`` differ — a decision flipped on the same inputs. A flip need not
      change the output (the other path may emit the same token), so flips are counted on
      their own, with the request, ``abs_pos`` and both values;
    * ``max_abs_dp`` and ``max_abs_dlogp``: the largest ``|Δp|`` and ``|Δlogp_target|``
      over aligned rows with the same token (``max_abs_dlogp`` null without the column);
    * ``differences``: what differs between the manifests (:func:`manifest_differences`).

    Args:
        run_a: a run folder or :class:`RunFrames` of one run.
        run_b: the other run of the same configuration.
        alpha: 1 − confidence level.

    Raises:
        ValueError: the runs differ in a configuration field other than batch size,
            dtype, device, variant or limit (named), or are not one run each.
    """
    a, b = _frames(run_a, "run_a"), _frames(run_b, "run_b")
    for name, fr in (("run_a", a), ("run_b", b)):
        if len(fr.manifests) != 1:
            raise ValueError(f"{name}: expected one run, got {len(fr.manifests)}")
    diff = manifest_differences(a.manifests[0].to_dict(), b.manifests[0].to_dict())
    _check_same_reference(diff)
    hd = hash_divergence(a.requests, b.requests, by=[], alpha=alpha).row(0, named=True)
    per = first_divergence(a.requests, b.requests, by=[], keep=[CLUSTER])
    never = np.iinfo(np.int32).max  # "no divergence": every round start qualifies
    cut = per.select(
        pl.col(f"{CLUSTER}_rel").alias("_rid_a"),
        pl.col(f"{CLUSTER}_ref").alias("_rid_b"),
        pl.col("first_pos").fill_null(never).alias("_cut"),
    )
    cols = ["kind", "pos", "abs_pos", "token", "p", "accepted", "passed_ratio"]
    need = [CLUSTER, *cols]
    la = _lazy(a.positions, "run_a positions", need)
    lb = _lazy(b.positions, "run_b positions", need)
    has_logp = all("logp_target" in lf.collect_schema().names() for lf in (la, lb))
    take = [*cols, "logp_target"] if has_logp else cols
    start = (pl.col("abs_pos") - pl.col("pos")).alias("_start")
    pa = la.select(pl.col(CLUSTER).alias("_rid_a"), start, *take).join(cut.lazy(), on="_rid_a")
    pb = lb.select(pl.col(CLUSTER).alias("_rid_b"), start, *take)
    joined = (
        pa.filter(pl.col("abs_pos") <= pl.col("_cut"))
        .join(pb, on=["_rid_b", "_start", "pos", "kind"], suffix="_b")
        .collect()
    )
    # The first position of each round whose draft differs: later rows of the round were
    # computed on different drafts.
    bad = (
        joined.filter((pl.col("kind") == "draft") & (pl.col("token") != pl.col("token_b")))
        .group_by("_rid_a", "_start")
        .agg(pl.col("pos").min().alias("_bad"))
    )
    aligned = (
        joined.join(bad, on=["_rid_a", "_start"], how="left")
        .filter(pl.col("_bad").is_null() | (pl.col("pos") <= pl.col("_bad")))
        .sort("_rid_a", "abs_pos", "kind")
    )
    same_tok = aligned.filter(pl.col("token") == pl.col("token_b"))
    flips = same_tok.filter(
        (pl.col("kind") == "draft")
        & (
            pl.col("accepted").ne_missing(pl.col("accepted_b"))
            | pl.col("passed_ratio").ne_missing(pl.col("passed_ratio_b"))
        )
    )

    def max_abs(col: str) -> float:
        if same_tok.height == 0:
            return 0.0
        v = (pl.col(col).cast(pl.Float64) - pl.col(f"{col}_b").cast(pl.Float64)).abs().max()
        return float(same_tok.select(v).item() or 0.0)

    return {
        "n": int(hd["n"]),
        "n_diverged": int(hd["n_diverged"]),
        "rate": float(hd["rate"]),
        "ci_low": float(hd["ci_low"]),
        "ci_high": float(hd["ci_high"]),
        "first_positions": sorted(per["first_pos"].drop_nulls().to_list()),
        "n_aligned": aligned.height,
        "n_token_diffs": aligned.height - same_tok.height,
        "n_flips": flips.height,
        "flips": flips.select(
            pl.col("_rid_a").alias(CLUSTER),
            "abs_pos",
            pl.col("_cut").replace(never, None).alias("first_pos"),
            pl.col("accepted").alias("accepted_a"),
            "accepted_b",
            pl.col("passed_ratio").alias("passed_ratio_a"),
            "passed_ratio_b",
        ).to_dicts(),
        "max_abs_dp": max_abs("p"),
        "max_abs_dlogp": max_abs("logp_target") if has_logp else None,
        "differences": {k: list(v) for k, v in diff.items()},
    }


def floor_sentence(
    n_diverged: int,
    n: int,
    *,
    compared: str = "greedy speculative and target-only decoding",
    unit: str = "items",
) -> str:
    """The noise floor in words (plain text).

    Zero: "0 of 60 items differ between greedy speculative and target-only decoding: no
    noise floor was seen here (at most 4.9 % at 95 % confidence)." Not zero: "7 of 60
    items (12 %) differ between …: divergence below this rate cannot be blamed on the
    relaxed rule."

    Args:
        n_diverged: paired units whose outputs differ.
        n: paired units in all.
        compared: what was compared, after "between".
        unit: the paired unit's plural ("items", "requests").
    """
    if isinstance(n_diverged, bool) or not isinstance(n_diverged, int | np.integer):
        raise TypeError(f"n_diverged: expected an int, got {n_diverged!r}")
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise TypeError(f"n: expected an int, got {n!r}")
    if n < 0 or not 0 <= n_diverged <= n:
        raise ValueError(f"n_diverged: must be in [0, n = {n}], got {n_diverged}")
    if n == 0:
        return f"No paired {unit} between {compared}: the noise floor was not measured."
    if n_diverged == 0:
        # 0 of n bounds the floor, it does not prove it zero: say how far (exact one-sided
        # 95 % upper bound 1 − 0.05^(1/n), about 3/n, the "rule of three").
        bound = 100.0 * (1.0 - 0.05 ** (1.0 / n))
        return (
            f"0 of {n} {unit} differ between {compared}: no noise floor was seen here "
            f"(at most {bound:.2g} % at 95 % confidence)."
        )
    pct = 100.0 * n_diverged / n
    share = f"{pct:.0f} %" if pct >= 1 else f"{pct:.1g} %"
    return (
        f"{n_diverged} of {n} {unit} ({share}) differ between {compared}: divergence below "
        "this rate cannot be blamed on the relaxed rule."
    )


def floor_sentences(floor: pl.DataFrame | Mapping[str, Any], **kw: Any) -> list[str]:
    """:func:`floor_sentence` of each floor in a result.

    Each row of a :func:`greedy_floor` frame, or a :func:`numeric_floor` dict (``n``,
    ``n_diverged``).
    """
    rows: Iterable[Mapping[str, Any]] = (
        floor.iter_rows(named=True) if isinstance(floor, pl.DataFrame) else [floor]
    )
    return [floor_sentence(int(r["n_diverged"]), int(r["n"]), **kw) for r in rows]
