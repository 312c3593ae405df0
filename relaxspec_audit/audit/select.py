"""Choosing θ (NSD) or a budget (ASD): the frontier, the non-inferior choice, the verdict.

THEORY §3 "Choosing θ or a budget": over a grid of settings, the frontier of speed vs
accuracy delta (each with an interval); the recommendation is the fastest setting that is
non-inferior at margin δ (and, optionally, whose mean per-token deviation ε stays under a
cap), chosen on the ``discovery`` split and re-tested on the disjoint ``confirmation``
split — a setting picked and judged on the same prompts overstates itself (winner's
curse). The sign-off is a :class:`Verdict`: ``PASS``, ``NO-GAIN``, ``FAIL`` or
``INCONCLUSIVE``; it is never ``PASS`` with fewer items than a power calculation asks for, nor
without a modelled speed-up whose lower confidence bound clears the minimum gain.

Speed here is the MODELLED speed-up (docs/STATISTICS.md §7): integer target passes per
request times the cost of one pass from the run's cost table, so identical logs give exactly
1.0 and the ranking cannot move with machine load. Wall-clock speed-ups are shown beside it,
labelled, and never decide.

Statistics come from :mod:`relaxspec_audit.audit` (accuracy, speed); only numpy, polars,
scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from relaxspec_audit.audit.accuracy import accuracy_delta
from relaxspec_audit.audit.frames import Frame, _lazy
from relaxspec_audit.audit.pairing import pair_requests
from relaxspec_audit.audit.records import Status, Verdict, VerdictNumbers
from relaxspec_audit.audit.runs import (
    COST_NOTE,
    COST_TABLE,
    PASS_COST,
    pass_cost,
    setting_params,
    settings_frame,
)
from relaxspec_audit.audit.speedup import paired_speedup
from relaxspec_audit.verify.registry import setting_words

__all__ = [
    "COST_NOTE",
    "COST_TABLE",
    "DEFAULT_MIN_GAIN",
    "PASS_COST",
    "Status",
    "Verdict",
    "assign_split",
    "frontier",
    "needed_items",
    "pass_cost",
    "planning_sd",
    "recommend",
    "requests_speedup",
    "required_items",
    "setting_params",
    "settings_frame",
]

#: Default minimum modelled speed-up over the reference that PASS needs (its lower bound
#: must exceed it): a relaxed rule that is not faster than its lossless reference buys
#: nothing for its fidelity cost.
DEFAULT_MIN_GAIN = 1.0


def required_items(
    sd_diff: float,
    ni_margin: float,
    *,
    true_delta: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Items needed by the one-sided paired non-inferiority t test on item means.

    :func:`relaxspec_audit.audit.power.required_items_mean` (Chow, Shao & Wang 2008,
    §3.2; solved for the noncentral t). The verdict sizes with :func:`needed_items`, which
    picks the test that is actually run (Tango's for one binary score per item).
    """
    from relaxspec_audit.audit.power import required_items_mean

    return required_items_mean(sd_diff, ni_margin, true_delta=true_delta, alpha=alpha,
                               power=power)  # fmt: skip


def planning_sd(sd_diff: float, n_items: int, binary: bool) -> float:
    """A conservative sd of item differences for planning from a small pilot.

    The pilot sd is used as is, except that with binary scores it is floored at
    ``√(3/n)``: with no (or few) discordant pairs among ``n`` items, the discordant rate
    is still plausibly up to ``3/n`` ("rule of three", Hanley & Lippman-Hand 1983), and
    ``σ_d² ≤ ψ``. Without a pilot (``n < 2``) binary scores get the worst case 1.
    """
    if n_items < 2 or not np.isfinite(sd_diff):
        return 1.0 if binary else float("nan")
    if binary:
        return float(max(sd_diff, math.sqrt(3.0 / n_items)))
    return float(sd_diff)


def _with_item_key(frame: Frame, name: str) -> pl.DataFrame:
    """Requests with ``item_id`` made unique across tasks (``task/item_id``)."""
    df = _lazy(frame, name, ["item_id", "score"]).collect()
    if "task" in df.columns:
        df = df.with_columns(pl.format("{}/{}", pl.col("task"), pl.col("item_id")).alias("item_id"))
    return df


def requests_speedup(
    rel: pl.DataFrame, ref: pl.DataFrame, *, alpha: float = 0.05, need_costs: bool = False
) -> dict[str, Any]:
    """Modelled speed-up of ``rel`` over ``ref`` from their requests frames (STATISTICS §7).

    The frontier's form of :func:`~relaxspec_audit.audit.speedup.modelled_speedup_paired`
    (which reads one run's rounds and manifest): here each requests row carries its run's
    ``pass_cost``, so a setting's rows may pool several runs. Per request the modelled
    time is ``target_passes · pass_cost`` (a speculative round is
    one verify pass and K draft steps; a target-only token one step; the cost of each
    comes from the run's cost table). Over the items both runs decoded::

        S = (Σ time_ref / Σ tokens_ref) / (Σ time_rel / Σ tokens_rel)

    with the item-jackknife interval of :func:`_paired_ratio_ci`. When the
    two frames have no ``pass_cost`` the cost of a pass is taken as equal in both (two
    speculative runs of one pair, K and batch size: it cancels), so ``S`` is the ratio of
    tokens per pass and ``basis`` says so. Identical counts give exactly 1.0, CI [1, 1].
    With ``need_costs`` (a comparison across kinds of pass, e.g. against target-only
    decoding, where the costs do not cancel) a missing cost table gives no estimate.

    Runs priced by different cost tables (ids in ``cost_table``) are still compared, with
    a ``note``; when only some rows carry a cost the comparison falls back to tokens per
    pass, also with a note. A flagged table's ``cost_note`` is carried into the note.

    Returns:
        ``{"speedup", "ci_low", "ci_high", "n_pairs", "basis", "note"}`` (``basis`` is
        ``"cost table"``, ``"passes"`` or ``"no cost table"`` with null numbers).
    """
    from relaxspec_audit.audit.speedup import _paired_ratio_ci

    def has(df: pl.DataFrame) -> pl.Series:
        return (
            df[PASS_COST].is_not_null()
            if PASS_COST in df.columns
            else pl.repeat(False, df.height, eager=True)
        )

    n_costed = int(has(rel).sum() + has(ref).sum())
    costed = n_costed == rel.height + ref.height
    note = None
    if not costed and n_costed:
        # Some runs priced, some not (older logs pooled with new): never mix the two bases.
        note = f"{rel.height + ref.height - n_costed} request(s) have no cost table"
    if need_costs and not costed:
        return {"speedup": None, "ci_low": None, "ci_high": None, "n_pairs": None,
                "basis": "no cost table", "note": note}  # fmt: skip
    if costed:
        ids = set()
        for df in (rel, ref):
            if COST_TABLE in df.columns:
                ids |= set(df[COST_TABLE].drop_nulls().unique().to_list())
        if len(ids) > 1:
            note = (f"priced by {len(ids)} different cost tables ({', '.join(sorted(ids))}): "
                    "another device, dtype, K or batch size; compare with care")  # fmt: skip
        flagged = [n for df in (rel, ref) if COST_NOTE in df.columns
                   for n in df[COST_NOTE].drop_nulls().unique(maintain_order=True)]  # fmt: skip
        if flagged:  # every number priced from a flagged table says so
            note = "; ".join(dict.fromkeys([*([note] if note else []), *flagged]))
    cols = ["target_passes", "n_tokens", *([PASS_COST] if costed else [])]
    pairs = pair_requests(rel, ref, cols, by=[])

    def time(side: str) -> np.ndarray:
        passes = pairs[f"target_passes_{side}"].cast(pl.Float64).to_numpy()
        return passes * pairs[f"{PASS_COST}_{side}"].to_numpy() if costed else passes

    tok = {s: pairs[f"n_tokens_{s}"].cast(pl.Float64).to_numpy() for s in ("ref", "rel")}
    est, lo, hi = _paired_ratio_ci(
        time("ref"), tok["ref"], time("rel"), tok["rel"], alpha, pairs["item_id"]
    )
    basis = "cost table" if costed else "passes"
    return {"speedup": est, "ci_low": lo, "ci_high": hi, "n_pairs": pairs.height,
            "basis": basis, "note": note}  # fmt: skip


def frontier(
    requests: Frame,
    reference: Frame,
    setting_cols: Sequence[str],
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    eps: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Modelled speed-up vs accuracy delta, one row per setting, with intervals (THEORY §3).

    For each setting (the distinct values of ``setting_cols`` in ``requests``), the
    paired accuracy delta against the reference over all its items (tasks pooled; item
    keys are ``task/item_id``) with its CI and one-sided non-inferiority p-value
    (:func:`accuracy_delta`), and the modelled speed-up over the reference with its CI
    (:func:`requests_speedup`: pass counts × the cost table, a function of the logs).
    The wall-clock speed-up of the collection (``wall_speedup``, from each request's
    ``wall_s``) is kept for reference only: it moves with machine load. ``pareto`` marks
    settings that no other setting beats on both modelled speed-up and delta.

    Args:
        requests: the relaxed runs' ``requests`` with the setting columns added
            (e.g. joined from :func:`settings_frame`, which also adds ``pass_cost``).
        reference: the reference run's ``requests`` (same items; with ``pass_cost`` when
            the relaxed ones have it).
        setting_cols: the columns that identify a setting (``["theta"]``,
            ``["budget", "gate", "cap"]``).
        ni_margin: non-inferiority margin δ.
        alpha: 1 − confidence level and the test level.
        eps: optional frame keyed by ``setting_cols`` with an ``eps`` column (mean
            per-token deviation ε of the setting, e.g. from
            :func:`~relaxspec_audit.audit.fidelity.deviation_accounting`).

    Returns:
        Columns ``*setting_cols, n_items, delta, ci_low, ci_high, ni_low, p_noninf, noninferior,
        sd_diff, binary, n10, n01, speedup, speedup_ci_low, speedup_ci_high, speed_basis,
        speed_note, wall_speedup, wall_ci_low, wall_ci_high, tau, pareto`` (and ``eps``); ``tau`` is
        tokens per target pass; ``n10``/``n01`` count discordant items (binary scores).
    """
    cols = list(setting_cols)
    if not cols:
        raise ValueError("setting_cols: give at least one column (e.g. ['theta'])")
    rel = _with_item_key(requests, "requests")
    missing = [c for c in cols if c not in rel.columns]
    if missing:
        raise ValueError(f"requests: missing setting column(s) {missing}")
    ref = _with_item_key(reference, "reference")
    ref = ref.drop([c for c in cols if c in ref.columns])
    rows = []
    for key, part in rel.partition_by(cols, as_dict=True, maintain_order=True).items():
        acc = accuracy_delta(part, ref, ni_margin=ni_margin, by=[], alpha=alpha).row(0, named=True)
        wall = paired_speedup(part, ref, by=[], alpha=alpha).row(0, named=True)
        spd = requests_speedup(part, ref, alpha=alpha)
        # Tokens per target pass over the setting's requests (THEORY §1, τ).
        tau = float(part["n_tokens"].sum()) / max(float(part["target_passes"].sum()), 1.0)
        # Discordant counts size Tango's test, which runs on one binary score per item.
        one = acc["binary"] and acc["n_pairs"] == acc["n_items"]
        n10, n01 = _discordant(part, ref) if one else (None, None)
        row = dict(zip(cols, key, strict=True))
        row.update(
            n_items=acc["n_items"],
            delta=acc["delta"],
            ci_low=acc["ci_low"],
            ci_high=acc["ci_high"],
            ni_low=acc["ni_low"],
            p_noninf=acc["p_noninf"],
            noninferior=bool(acc["p_noninf"] < alpha),
            sd_diff=acc["sd_diff"],
            binary=acc["binary"],
            n10=n10,
            n01=n01,
            speedup=spd["speedup"],
            speedup_ci_low=spd["ci_low"],
            speedup_ci_high=spd["ci_high"],
            speed_basis=spd["basis"],
            speed_note=spd["note"],
            wall_speedup=wall["speedup"],
            wall_ci_low=wall["ci_low"],
            wall_ci_high=wall["ci_high"],
            tau=tau,
        )
        rows.append(row)
    out = pl.DataFrame(rows, schema_overrides={"speed_note": pl.String})
    s, d = out["speedup"].to_numpy(), out["delta"].to_numpy()
    dominated = [
        bool(np.any((s >= s[i]) & (d >= d[i]) & ((s > s[i]) | (d > d[i])))) for i in range(len(s))
    ]
    out = out.with_columns(pl.Series("pareto", [not x for x in dominated]))
    if eps is not None:
        out = out.join(eps.select(*cols, "eps"), on=cols, how="left")
    return out.sort(cols)


def _discordant(rel: pl.DataFrame, ref: pl.DataFrame) -> tuple[int, int]:
    """Items where only the relaxed run (n10) or only the reference (n01) scores 1."""
    pairs = pair_requests(rel, ref, ["score"], by=[]).filter(
        pl.col("score_rel").is_not_null() & pl.col("score_ref").is_not_null()
    )
    items = pairs.group_by("item_id").agg(pl.col("score_rel").mean(), pl.col("score_ref").mean())
    d = (items["score_rel"] - items["score_ref"]).to_numpy()
    return int(np.sum(d > 0)), int(np.sum(d < 0))


def _fastest(df: pl.DataFrame, setting_cols: Sequence[str] = ()) -> dict[str, Any]:
    """The fastest setting by the modelled speed-up; ties broken from the logs.

    The modelled speed-up is a function of the logs (pass counts × one cost table), so the
    same logs always give the same choice; within one family (one draft, K, batch size) it
    orders settings as τ does. Settings with equal speed-up (typically identical outputs)
    are ordered by the larger accuracy delta, the smaller deviation ``eps`` (when given),
    then the smaller setting values. Wall-clock speed-ups never rank: they move by several
    percent between identical runs on a shared machine.
    """
    keys = [("speedup", True), ("tau", True), ("delta", True), ("eps", False)]
    keys += [(c, False) for c in setting_cols]
    keys = [(c, desc) for c, desc in keys if c in df.columns]
    ordered = df.sort([c for c, _ in keys], descending=[d for _, d in keys], nulls_last=True)
    return ordered.row(0, named=True)


def _split(df: pl.DataFrame, col: str, value: str, name: str) -> pl.DataFrame:
    part = df.filter(pl.col(col) == value)
    if part.height == 0:
        have = sorted(df[col].drop_nulls().unique().to_list())
        raise ValueError(f"{name}: no requests with {col} == {value!r} (have {have})")
    return part


def recommend(
    requests: Frame,
    reference: Frame,
    setting_cols: Sequence[str],
    *,
    ni_margin: float = 0.02,
    eps_cap: float | None = None,
    eps: pl.DataFrame | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    min_items: int = 30,
    min_gain: float = DEFAULT_MIN_GAIN,
    split_col: str = "split",
    discovery: str = "discovery",
    confirmation: str = "confirmation",
) -> Verdict:
    """The fastest non-inferior setting, chosen on discovery, confirmed on confirmation.

    Steps (THEORY §3):

    1. Split requests and reference by ``split_col``; the two splits must not share an
       item (else ``ValueError``).
    2. Discovery frontier (:func:`frontier`); candidates are non-inferior at ``ni_margin``
       (one-sided p < α) and, with ``eps_cap``, have ``eps ≤ eps_cap``. None → ``FAIL``
       when every setting is shown inferior (CI upper end < −ni_margin) or over the cap,
       else ``INCONCLUSIVE``.
    3. The fastest candidate (:func:`_fastest`: the largest modelled speed-up, ties
       broken by accuracy delta, deviation, then setting values) is re-tested on the
       confirmation split alone. Its item count must reach ``max(min_items,
       n_required)`` where ``n_required`` is :func:`needed_items` for the test that is
       run (Tango's score test at discovery's discordance for one binary score per item,
       else the paired t on item means at discovery's sd), true delta 0, level α and
       ``power`` — else ``INCONCLUSIVE`` with ``n_required``.
    4. Confirmation not non-inferior → ``FAIL`` (shown inferior, or not shown
       non-inferior by an adequately powered test). Non-inferior and the lower bound of
       the modelled speed-up over the reference above ``min_gain`` → ``PASS``;
       non-inferior without that gain → ``NO-GAIN``.

    Args:
        requests: relaxed runs' ``requests`` with the setting columns and ``split``.
        reference: the reference run's ``requests`` (with ``split``).
        setting_cols: columns identifying a setting.
        ni_margin: non-inferiority margin δ (score units).
        eps_cap: optional cap on the setting's mean per-token deviation ε.
        eps: frame keyed by ``setting_cols`` with column ``eps`` (needed with a cap).
        alpha: test level.
        power: power for the sample-size requirement.
        min_items: never certify on fewer confirmation items than this.
        min_gain: PASS needs the modelled speed-up's lower bound above this (≥ 0).
        split_col: split column.
        discovery: discovery split value.
        confirmation: confirmation split value.

    Returns:
        The :class:`Verdict`.
    """
    if not (min_gain >= 0 and math.isfinite(min_gain)):
        raise ValueError(f"min_gain: must be a finite number >= 0, got {min_gain}")
    cols = list(setting_cols)
    if eps_cap is not None and eps is None:
        raise ValueError("eps: an eps frame (setting columns + 'eps') is needed with eps_cap")
    rel = _with_item_key(requests, "requests")
    ref = _with_item_key(reference, "reference")
    for df, name in ((rel, "requests"), (ref, "reference")):
        if split_col not in df.columns:
            raise ValueError(f"{name}: missing column {split_col!r} (discovery/confirmation)")
    rel_d = _split(rel, split_col, discovery, "requests")
    rel_c = _split(rel, split_col, confirmation, "requests")
    ref_d = _split(ref, split_col, discovery, "reference")
    ref_c = _split(ref, split_col, confirmation, "reference")
    overlap = set(rel_d["item_id"]) & set(rel_c["item_id"])
    overlap |= set(ref_d["item_id"]) & set(ref_c["item_id"])
    if overlap:
        raise ValueError(
            f"{split_col}: {len(overlap)} item(s) in both {discovery!r} and {confirmation!r} "
            f"(e.g. {sorted(overlap)[:3]}); the splits must be disjoint"
        )
    numbers: dict[str, Any] = {"ni_margin": ni_margin, "alpha": alpha, "power": power}
    numbers["min_gain"] = min_gain
    numbers["eps_cap"] = eps_cap
    reasons: list[str] = []

    def verdict(status: Status, setting: Mapping[str, Any] | None, n: int | None) -> Verdict:
        return Verdict(status=status, setting=setting, reasons=reasons,
                       numbers=VerdictNumbers(**numbers), n_required=n)  # fmt: skip

    fd = frontier(rel_d, ref_d, cols, ni_margin=ni_margin, alpha=alpha, eps=eps)
    numbers["discovery"] = fd.to_dicts()
    cand = fd.filter(pl.col("noninferior"))
    if eps_cap is not None:
        over = fd.filter(pl.col("eps").is_null() | (pl.col("eps") > eps_cap))
        if over.height:
            reasons.append(f"{over.height} setting(s) exceed the deviation cap ε ≤ {eps_cap}")
        cand = cand.filter(pl.col("eps") <= eps_cap)

    n_disc = int(fd["n_items"].max())
    if cand.height == 0:
        inferior = fd.filter(pl.col("ci_high") < -ni_margin)
        allowed = fd if eps_cap is None else fd.filter(pl.col("eps") <= eps_cap)
        if allowed.height == 0 or allowed.filter(pl.col("ci_high") >= -ni_margin).height == 0:
            reasons.append(
                f"no setting is non-inferior at δ = {_pt(ni_margin, sign=False)} on discovery: "
                f"{inferior.height} of {fd.height} are shown inferior "
                f"(CI upper < −{_pt(ni_margin, sign=False)})"
            )
            return verdict("FAIL", None, None)
        best = _fastest(allowed.filter(pl.col("ci_high") >= -ni_margin), cols)
        n_req, plan = needed_items(best, ni_margin, alpha=alpha, power=power)
        n_req = max(min_items, n_req)
        reasons.append(
            f"no setting shown non-inferior at δ = {_pt(ni_margin, sign=False)} on discovery "
            f"({n_disc} items); about {n_req} items per split are needed for power {power} "
            f"({_plan_words(plan)})"
        )
        numbers["planning"] = plan
        return verdict("INCONCLUSIVE", None, n_req)

    chosen = _fastest(cand, cols)
    setting = {c: chosen[c] for c in cols}
    reasons.append(
        f"discovery: fastest non-inferior setting {setting_words(setting)} "
        f"(modelled speed-up {_x(chosen['speedup'])}×, τ {_x(chosen.get('tau'))}, "
        f"accuracy Δ {_pt(chosen['delta'])}, p {chosen['p_noninf']:.3g}, "
        f"{chosen['n_items']} items)"
    )
    n_req, plan = needed_items(chosen, ni_margin, alpha=alpha, power=power)
    n_req = max(min_items, n_req)
    numbers["planning"] = plan

    match = pl.all_horizontal([pl.col(c) == v for c, v in setting.items()])
    conf_rel = rel_c.filter(match)
    if conf_rel.height == 0:
        reasons.append(f"confirmation: no requests for setting {setting_words(setting)}")
        return verdict("INCONCLUSIVE", setting, n_req)
    fc = frontier(conf_rel, ref_c, cols, ni_margin=ni_margin, alpha=alpha, eps=eps).row(
        0, named=True
    )
    numbers["confirmation"] = fc
    if fc["n_items"] < n_req:
        reasons.append(
            f"confirmation has {fc['n_items']} items; at least {n_req} are needed "
            f"(power {power} at δ = {_pt(ni_margin, sign=False)}, {_plan_words(plan)}, "
            f"minimum {min_items})"
        )
        return verdict("INCONCLUSIVE", setting, n_req)
    if not fc["noninferior"]:
        shown = "shown inferior" if fc["ci_high"] < -ni_margin else "not shown non-inferior"
        reasons.append(
            f"confirmation: {shown} at δ = {_pt(ni_margin, sign=False)} (accuracy Δ "
            f"{_pt(fc['delta'])}, {_ni_bound(fc, alpha)}, "
            f"{_level(alpha)} CI [{_pt(fc['ci_low'])}, {_pt(fc['ci_high'])}], "
            f"p {fc['p_noninf']:.3g})"
        )
        return verdict("FAIL", setting, n_req)
    reasons.append(
        f"confirmation: non-inferior at δ = {_pt(ni_margin, sign=False)} (accuracy Δ "
        f"{_pt(fc['delta'])}, {_ni_bound(fc, alpha)}, "
        f"{_level(alpha)} CI [{_pt(fc['ci_low'])}, {_pt(fc['ci_high'])}], "
        f"p {fc['p_noninf']:.3g}, "
        f"{fc['n_items']} items)"
    )
    gain = (
        f"modelled speed-up over the reference {_x(fc['speedup'])}× "
        f"[{_x(fc['speedup_ci_low'])}, {_x(fc['speedup_ci_high'])}] ({fc['speed_basis']})"
    )
    if fc.get("speed_note"):
        gain += f" — {fc['speed_note']}"
    low = fc["speedup_ci_low"]
    if low is not None and math.isfinite(low) and low > min_gain:
        reasons.append(f"{gain}: its lower bound clears the minimum gain {min_gain:g}×")
        return verdict("PASS", setting, n_req)
    reasons.append(
        f"{gain}: not shown above the minimum gain {min_gain:g}×, so the relaxation "
        "buys no speed here"
    )
    return verdict("NO-GAIN", setting, n_req)


def _pt(value: float, *, sign: bool = True) -> str:
    """A score difference (or margin) in points for a reason line: ``-1.7 pt``."""
    return f"{100 * value:{'+' if sign else ''}.1f} pt"


def _level(alpha: float) -> str:
    """``95%`` for α = 0.05: the two-sided interval's confidence level."""
    return f"{100 * (1 - alpha):g}%"


def _ni_bound(row: Mapping[str, Any], alpha: float) -> str:
    """The one-sided bound the non-inferiority test inverts, for a reason line.

    It, not the two-sided interval, decides: at level α a setting is non-inferior when
    this bound clears −δ, even where the two-sided 1 − α interval reaches below it.
    """
    low = row.get("ni_low")
    shown = "n/a" if low is None or not math.isfinite(low) else _pt(low)
    return f"one-sided {_level(alpha)} lower bound {shown}"


def _x(value: float | None) -> str:
    """A speed-up or τ for a reason line (``n/a`` when unknown)."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}"


def _plan_words(plan: Mapping[str, Any]) -> str:
    """How the size was planned, in words: test, planning effect, power achieved."""
    words = [str(plan["test"])]
    if plan.get("planning_effect") is not None:
        words.append(f"planned at a true Δ of {_pt(plan['planning_effect'])}")
    words.append(str(plan["note"]))
    if plan.get("power_achieved") is not None:
        words.append(f"power achieved {plan['power_achieved']:.2f}, {plan.get('power_method')}")
    return ", ".join(words)


def needed_items(
    row: Mapping[str, Any], ni_margin: float, *, alpha: float = 0.05, power: float = 0.8
) -> tuple[int, dict[str, Any]]:
    """Items per split the confirmation test needs, sized for the test that is run.

    ``row`` is a discovery :func:`frontier` row; the sizing and its plan (test, planning
    value and effect, power achieved) are :func:`~relaxspec_audit.audit.power.plan_from_row`.
    """
    from relaxspec_audit.audit.power import plan_from_row

    return plan_from_row(row, ni_margin, alpha=alpha, power=power)


def assign_split(item_ids: Sequence[str], *, confirmation_share: float = 0.5) -> list[str]:
    """Deterministic discovery/confirmation split of item ids (sha256 of the id).

    For logs whose ``split`` column is not ``discovery``/``confirmation``: the same item
    always lands in the same split, in every run and process.
    """
    import hashlib

    if not 0 < confirmation_share < 1:
        raise ValueError(f"confirmation_share: must be in (0, 1), got {confirmation_share}")
    out = []
    for item in item_ids:
        h = int.from_bytes(hashlib.sha256(str(item).encode()).digest()[:8], "little")
        out.append("confirmation" if h / 2**64 < confirmation_share else "discovery")
    return out
