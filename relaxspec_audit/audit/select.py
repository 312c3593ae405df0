"""Choosing θ (NSD) or a budget (ASD): the frontier, the non-inferior choice, the verdict.

THEORY §3 "Choosing θ or a budget": over a grid of settings, the frontier of speed vs
accuracy delta (each with an interval); the recommendation is the fastest setting that is
non-inferior at margin δ (and, optionally, whose mean per-token deviation ε stays under a
cap), chosen on the ``discovery`` split and re-tested on the disjoint ``confirmation``
split — a setting picked and judged on the same prompts overstates itself (winner's
curse). The sign-off is a :class:`Verdict`: ``PASS``, ``FAIL`` or ``INCONCLUSIVE``; it is
never ``PASS`` with fewer items than a power calculation asks for.

Statistics come from :mod:`relaxspec_audit.audit` (accuracy, speed); only numpy, polars,
scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl

from relaxspec_audit._compat import renamed_kwargs
from relaxspec_audit.audit.accuracy import accuracy_delta
from relaxspec_audit.audit.frames import Frame, _lazy, json_safe
from relaxspec_audit.audit.speedup import paired_speedup

Status = Literal["PASS", "FAIL", "INCONCLUSIVE"]


@dataclass(frozen=True)
class Verdict:
    """The sign-off of a relaxed setting (THEORY §3).

    Attributes:
        status: ``PASS`` (non-inferior at δ on the confirmation split, with
            enough items), ``FAIL`` (shown inferior, over the ε cap, or not non-inferior
            with an adequately powered confirmation), or ``INCONCLUSIVE`` (too few items
            to decide; ``n_required`` says how many).
        setting: the chosen setting (e.g. ``{"theta": 0.9}``), or None.
        reasons: plain-language reasons, in the order they were established.
        numbers: the numbers behind the decision (frontier, confirmation row, ``ni_margin``…).
        n_required: items per split needed for the one-sided non-inferiority test to
            have the requested power (:func:`required_items`), when computed.
    """

    status: Status
    setting: dict[str, Any] | None
    reasons: list[str]
    numbers: dict[str, Any] = field(default_factory=dict)
    n_required: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (non-finite floats become None)."""
        return json_safe(asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent)


@renamed_kwargs(margin="ni_margin")
def required_items(
    sd_diff: float,
    ni_margin: float,
    *,
    true_delta: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Items needed by the one-sided paired non-inferiority t test.

    H0 ``delta ≤ −ni_margin`` vs H1 ``delta > −ni_margin`` on per-item differences with sd
    ``σ_d``, when the true delta is ``true_delta``. Normal approximation (Chow, Shao &
    Wang 2008, *Sample Size Calculations in Clinical Research*, §3.1.2/§3.2.2; Julious
    2004, Stat. Med. 23:1921)::

        n ≈ (z_{1−α} + z_{1−β})² σ_d² / (true_delta + ni_margin)²

    solved exactly for the noncentral t with statsmodels ``TTestPower.solve_power``
    (one-sample t on differences, ``alternative="larger"``). For paired binary scores
    ``σ_d² = ψ − delta²`` with ``ψ`` the discordant-pair rate (Nam 1997, Biometrics 53;
    Liu et al. 2002, Stat. Med. 21).

    Raises:
        ValueError: ``ni_margin + true_delta ≤ 0`` (no power possible) or ``sd_diff < 0``.
    """
    from statsmodels.stats.power import TTestPower

    effect = true_delta + ni_margin
    if effect <= 0:
        raise ValueError(f"ni_margin: ni_margin + true_delta must be > 0, got {effect}")
    if not sd_diff >= 0:
        raise ValueError(f"sd_diff: must be >= 0, got {sd_diff}")
    if sd_diff == 0:
        return 2
    n = TTestPower().solve_power(
        effect_size=effect / sd_diff, alpha=alpha, power=power, alternative="larger"
    )
    return max(2, math.ceil(float(np.atleast_1d(n)[0])))


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


def setting_params(rule: str) -> tuple[str, ...]:
    """The parameters that define a setting of ``rule`` (the registry's, in its order)."""
    from relaxspec_audit.verify.registry import RULES

    return RULES[rule].param_names if rule in RULES else ()


def settings_frame(manifests: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """One row per run: ``run`` (run id), ``rule`` and the rule's resolved parameters.

    Join it to a ``requests`` scan on ``run`` (the hive key of ``logs.scan``) to get the
    setting columns :func:`frontier` groups by. Parameters are resolved by the registry
    (defaults filled in), so a run at the default θ and one that names θ = 0.95 are the
    same setting, and a setting given only its budget has its gate and cap too.
    """
    from relaxspec_audit.verify.registry import RULES, params_dict, resolve_params

    rows = []
    for m in manifests:
        cfg = m.get("config", {})
        rule = cfg.get("rule")
        row = {"run": m.get("run_id"), "rule": rule}
        if rule in RULES:
            row.update(params_dict(resolve_params(rule, cfg.get("params"))))
        rows.append(row)
    # An int parameter that is ∞ in some run (an uncapped ASD) is a float column.
    floats = {k for row in rows for k, v in row.items() if isinstance(v, float)}
    rows = [{k: float(v) if k in floats else v for k, v in row.items()} for row in rows]
    return pl.DataFrame(rows)


def _with_item_key(frame: Frame, name: str) -> pl.DataFrame:
    """Requests with ``item_id`` made unique across tasks (``task/item_id``)."""
    df = _lazy(frame, name, ["item_id", "score"]).collect()
    if "task" in df.columns:
        df = df.with_columns(pl.format("{}/{}", pl.col("task"), pl.col("item_id")).alias("item_id"))
    return df


@renamed_kwargs(margin="ni_margin")
def frontier(
    requests: Frame,
    reference: Frame,
    setting_cols: Sequence[str],
    *,
    ni_margin: float = 0.02,
    alpha: float = 0.05,
    eps: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Speedup vs accuracy delta, one row per setting, with intervals (THEORY §3).

    For each setting (the distinct values of ``setting_cols`` in ``requests``), the
    paired accuracy delta against the reference over all its items (tasks pooled; item
    keys are ``task/item_id``) with its CI and one-sided non-inferiority p-value
    (:func:`accuracy_delta`), and the speedup over the reference with its CI
    (:func:`paired_speedup`). ``pareto`` marks settings that no other setting beats
    on both speedup and delta.

    Args:
        requests: the relaxed runs' ``requests`` with the setting columns added
            (e.g. joined from :func:`settings_frame`).
        reference: the reference run's ``requests`` (same items).
        setting_cols: the columns that identify a setting (``["theta"]``,
            ``["budget", "gate", "cap"]``).
        ni_margin: non-inferiority margin δ.
        alpha: 1 − confidence level and the test level.
        eps: optional frame keyed by ``setting_cols`` with an ``eps`` column (mean
            per-token deviation ε of the setting, e.g. from
            :func:`~relaxspec_audit.audit.fidelity.deviation_accounting`).

    Returns:
        Columns ``*setting_cols, n_items, delta, ci_low, ci_high, p_noninf, noninferior,
        sd_diff, binary, speedup, speedup_ci_low, speedup_ci_high, tau, pareto`` (and
        ``eps``); ``tau`` is null when the requests lack ``n_tokens``/``target_passes``.
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
        spd = paired_speedup(part, ref, by=[], alpha=alpha).row(0, named=True)
        tau = None
        if {"n_tokens", "target_passes"} <= set(part.columns):
            # Tokens per target pass over the setting's requests (THEORY §1, τ).
            tau = float(part["n_tokens"].sum()) / max(float(part["target_passes"].sum()), 1.0)
        row = dict(zip(cols, key, strict=True))
        row.update(
            n_items=acc["n_items"],
            delta=acc["delta"],
            ci_low=acc["ci_low"],
            ci_high=acc["ci_high"],
            p_noninf=acc["p_noninf"],
            noninferior=bool(acc["p_noninf"] < alpha),
            sd_diff=acc["sd_diff"],
            binary=acc["binary"],
            speedup=spd["speedup"],
            speedup_ci_low=spd["ci_low"],
            speedup_ci_high=spd["ci_high"],
            tau=tau,
        )
        rows.append(row)
    out = pl.DataFrame(rows)
    s, d = out["speedup"].to_numpy(), out["delta"].to_numpy()
    dominated = [
        bool(np.any((s >= s[i]) & (d >= d[i]) & ((s > s[i]) | (d > d[i])))) for i in range(len(s))
    ]
    out = out.with_columns(pl.Series("pareto", [not x for x in dominated]))
    if eps is not None:
        out = out.join(eps.select(*cols, "eps"), on=cols, how="left")
    return out.sort(cols)


def _fastest(df: pl.DataFrame, setting_cols: Sequence[str] = ()) -> dict[str, Any]:
    """The fastest setting: most tokens per target pass; ties broken from the logs.

    τ is a deterministic function of the logs; within one rule family the draft and K are
    fixed, so the cost of a target pass plus its draft passes is about the same for every
    setting and τ orders them as the modelled speedup ``τ / (1 + K·c)`` does (THEORY §1).
    Settings with equal τ (typically identical outputs) are ordered by the larger accuracy
    delta, the smaller deviation ``eps`` (when given), then the smaller setting values:
    all functions of the logs, so the same logs always give the same choice. Wall-clock
    speedups move by several percent between identical runs on a shared machine and are
    used only when τ is unknown.
    """
    if "tau" in df.columns and df["tau"].null_count() < df.height:
        keys = [("tau", True), ("delta", True), ("eps", False)]
        keys += [(c, False) for c in setting_cols]
        keys = [(c, desc) for c, desc in keys if c in df.columns]
        ordered = df.sort([c for c, _ in keys], descending=[d for _, d in keys], nulls_last=True)
        return ordered.row(0, named=True)
    return df.sort("speedup").row(-1, named=True)


def _split(df: pl.DataFrame, col: str, value: str, name: str) -> pl.DataFrame:
    part = df.filter(pl.col(col) == value)
    if part.height == 0:
        have = sorted(df[col].drop_nulls().unique().to_list())
        raise ValueError(f"{name}: no requests with {col} == {value!r} (have {have})")
    return part


@renamed_kwargs(margin="ni_margin")
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
    3. The fastest candidate (:func:`_fastest`: most tokens per target pass, ties broken
       by accuracy delta, deviation, then setting values) is re-tested on the
       confirmation split alone. Its item count must reach ``max(min_items,
       n_required)`` where ``n_required`` is :func:`required_items` at the discovery sd
       (:func:`planning_sd`), true delta 0, level α and ``power`` — else
       ``INCONCLUSIVE`` with ``n_required``.
    4. Confirmation non-inferior → ``PASS``; otherwise ``FAIL`` (shown inferior, or not
       shown non-inferior by an adequately powered test).

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
        split_col: split column.
        discovery: discovery split value.
        confirmation: confirmation split value.

    Returns:
        The :class:`Verdict`.
    """
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
    numbers["eps_cap"] = eps_cap
    reasons: list[str] = []

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
                f"no setting is non-inferior at δ = {ni_margin} on discovery: "
                f"{inferior.height} of {fd.height} are shown inferior (CI upper < −{ni_margin})"
            )
            return Verdict("FAIL", None, reasons, numbers)
        best = _fastest(allowed.filter(pl.col("ci_high") >= -ni_margin), cols)
        sd = planning_sd(best["sd_diff"], best["n_items"], best["binary"])
        n_req = required_items(sd, ni_margin, alpha=alpha, power=power)
        reasons.append(
            f"no setting shown non-inferior at δ = {ni_margin} on discovery "
            f"({n_disc} items); about {n_req} items per split are needed for power {power}"
        )
        numbers["planning_sd"] = sd
        return Verdict("INCONCLUSIVE", None, reasons, numbers, n_required=n_req)

    chosen = _fastest(cand, cols)
    setting = {c: chosen[c] for c in cols}
    reasons.append(
        f"discovery: fastest non-inferior setting {setting} "
        f"(tau {chosen.get('tau') or float('nan'):.3g}, speedup {chosen['speedup']:.3g}, "
        f"delta {chosen['delta']:+.4f}, "
        f"p_noninf {chosen['p_noninf']:.3g}, {chosen['n_items']} items)"
    )
    sd = planning_sd(chosen["sd_diff"], chosen["n_items"], chosen["binary"])
    n_req = max(min_items, required_items(sd, ni_margin, alpha=alpha, power=power))
    numbers["planning_sd"] = sd

    match = pl.all_horizontal([pl.col(c) == v for c, v in setting.items()])
    conf_rel = rel_c.filter(match)
    if conf_rel.height == 0:
        reasons.append(f"confirmation: no requests for setting {setting}")
        return Verdict("INCONCLUSIVE", setting, reasons, numbers, n_required=n_req)
    fc = frontier(conf_rel, ref_c, cols, ni_margin=ni_margin, alpha=alpha, eps=eps).row(
        0, named=True
    )
    numbers["confirmation"] = fc
    if fc["n_items"] < n_req:
        reasons.append(
            f"confirmation has {fc['n_items']} items; at least {n_req} are needed "
            f"(power {power} at δ = {ni_margin}, planning sd {sd:.3g}, minimum {min_items})"
        )
        return Verdict("INCONCLUSIVE", setting, reasons, numbers, n_required=n_req)
    if fc["noninferior"]:
        reasons.append(
            f"confirmation: non-inferior at δ = {ni_margin} (delta {fc['delta']:+.4f}, "
            f"CI [{fc['ci_low']:+.4f}, {fc['ci_high']:+.4f}], p {fc['p_noninf']:.3g}, "
            f"{fc['n_items']} items); speedup {fc['speedup']:.3g}"
        )
        return Verdict("PASS", setting, reasons, numbers, n_required=n_req)
    shown = "shown inferior" if fc["ci_high"] < -ni_margin else "not shown non-inferior"
    reasons.append(
        f"confirmation: {shown} at δ = {ni_margin} (delta {fc['delta']:+.4f}, "
        f"CI [{fc['ci_low']:+.4f}, {fc['ci_high']:+.4f}], p {fc['p_noninf']:.3g})"
    )
    return Verdict("FAIL", setting, reasons, numbers, n_required=n_req)


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
