"""The fidelity evidence beside a verdict: noise floor, attribution, likelihood, coupling.

An audit that blames the relaxed rule for divergence the lossless decoder shows by itself
misleads its reader (docs/STATISTICS.md "Noise floor"). Per relaxed family, from the logs:

* the **greedy floor**: strict greedy speculative decoding against target-only decoding at
  T = 0 on the same items — lossless, so any difference is numerical;
* the **numeric floor**: the reference against its ``noise_floor`` replica (another batch
  size or dtype), when the batch ran one;
* the **attribution** of every first divergence between the relaxed run and its reference:
  at a decision of the relaxed rule, or not (numerics);
* the **likelihood** delta: mean log-likelihood per emitted token under the untransformed
  target, relaxed − reference — an open-ended task's fidelity measure beyond divergence;
* **coupling**: what one shared random stream saved in items, from the batch's
  ``coupling`` replica on another seed (THEORY §4).

Each block is a typed record (:mod:`~relaxspec_audit.audit.results`) with its sentence;
:func:`guarded` turns a block's failure into a :class:`~.results.Failed` record so that a
defect in the evidence never loses the sign-off it explains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import polars as pl

from relaxspec_audit.audit.records import (
    Attribution,
    Coupling,
    Failed,
    GreedyFloor,
    Loglik,
    NoiseFloor,
    NumericFloor,
    plain,
)
from relaxspec_audit.audit.runs import TaskRuns
from relaxspec_audit.verify import registry

T = TypeVar("T")


def guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | Failed:
    """An evidence block, or a :class:`Failed` record naming why it could not be computed.

    The verdict stands on the accuracy test and the modelled speed-up; these blocks
    explain it, so a failure in one shows as that block's ``error``.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return Failed(error=f"{type(exc).__name__}: {exc}")


def _row_dict(frame: pl.DataFrame | None) -> dict[str, Any] | None:
    return plain(frame.row(0, named=True)) if frame is not None and frame.height else None


def greedy_floor_facts(greedy_dir: str, target_dir: str, *, alpha: float) -> GreedyFloor:
    """The greedy-family floor between two run folders (``audit.noise.greedy_floor``)."""
    from relaxspec_audit.audit.noise import floor_sentence, greedy_floor
    from relaxspec_audit.collect import logs

    row = _row_dict(
        greedy_floor(logs.scan([greedy_dir], "requests"), logs.scan([target_dir], "requests"),
                     alpha=alpha, by=[])
    ) or {"n": 0, "n_diverged": 0}  # fmt: skip
    row["sentence"] = floor_sentence(int(row["n_diverged"]), int(row["n"]))
    return GreedyFloor(**row)


def numeric_floor_facts(
    main_dir: str, replica_dir: str, variant: str, *, alpha: float
) -> NumericFloor:
    """The numeric floor between a reference run and its replica (``audit.noise``)."""
    from relaxspec_audit.audit.noise import floor_sentence, numeric_floor

    out = plain(numeric_floor(main_dir, replica_dir, alpha=alpha))
    out.pop("flips", None)  # per-row detail: the notebook shows it, the summary counts it
    # What actually ran differently (the engine's batch size, not the config's "auto").
    names = {"engine.batch_size": "batch size", "config.dtype": "dtype", "config.device": "device"}
    diffs = out.get("differences", {})
    what = ", ".join(f"{label} {diffs[k][0]} vs {diffs[k][1]}" for k, label in names.items()
                     if k in diffs)  # fmt: skip
    out["sentence"] = floor_sentence(
        int(out["n_diverged"]),
        int(out["n"]),
        compared=f"the reference decoded two ways ({what or 'replica'})",
    ) + (f" {out['n_flips']} decision(s) flipped on the same inputs." if out["n_flips"] else "")
    return NumericFloor(variant=variant, **out)


def floor_facts(runs: TaskRuns, row: Mapping[str, Any], *, alpha: float) -> NoiseFloor:
    """The noise floor of one family: greedy floor (T = 0) and/or the numeric floors.

    Args:
        runs: the task's runs (replicas included).
        row: the shown setting's audit-table row (with ``run_dir``/``reference_dir``).
        alpha: 1 − confidence level.
    """
    ref_dir = row.get("reference_dir")
    greedy = None
    numeric: list[NumericFloor] = []
    main = runs.table.filter(pl.col("run_dir") == ref_dir)
    ref = main.row(0, named=True) if main.height else None
    spec = registry.RULES.get(ref["rule"]) if ref is not None else None
    if ref is not None and spec is not None and spec.greedy_only and spec.lossless:
        base = runs.baseline_of(ref)
        hit = runs.table.filter(pl.col("run_dir") == base) if base else None
        if hit is not None and hit.height and hit["temperature"][0] == 0:
            greedy = greedy_floor_facts(ref_dir, base, alpha=alpha)
    if ref is not None:
        # Each replica decodes the reference on its own split (discovery) with one thing
        # changed (batch size or dtype); its twin is the main run of that rule with the
        # same items, seed and sampling, whatever the shown split.
        for rep in runs.replicas(ref, "floor-").iter_rows(named=True):
            twin = runs.twin(rep)
            if twin is not None:
                numeric.append(
                    numeric_floor_facts(twin, rep["run_dir"], rep["variant"], alpha=alpha)
                )
    blocks = [b for b in (greedy, *numeric) if b is not None]
    parts = [b.sentence for b in blocks]
    sentence = (
        " ".join(parts)
        if parts
        else (
            "not measured: the batch ran no target-only greedy run nor a noise_floor replica "
            "for this reference"
        )
    )
    shorts = [f"{b.n_diverged}/{b.n}" for b in blocks]
    return NoiseFloor(
        greedy=greedy,
        numeric=numeric,
        sentence=sentence,
        short=" · ".join(shorts) if shorts else None,
    )


def attribution_facts(rel_dir: str, ref_dir: str, rule: str, *, alpha: float) -> Attribution:
    """Where and why the relaxed run's outputs first left the reference's."""
    from relaxspec_audit.audit.attribution import attribute_divergence, attribution_summary
    from relaxspec_audit.audit.pairing import pair_requests
    from relaxspec_audit.collect import logs

    rel_req = logs.scan([rel_dir], "requests").collect()
    ref_req = logs.scan([ref_dir], "requests").collect()
    spec = registry.RULES.get(rule)
    att = attribute_divergence(logs.scan([rel_dir], "positions"), rel_req, ref_req, by=[],
                               rule_recovery=bool(spec and spec.own_recovery))  # fmt: skip
    n_pairs = pair_requests(rel_req, ref_req, ["n_tokens"], by=[]).height
    out = plain(attribution_summary(att, n_pairs=n_pairs, alpha=alpha))
    n, counts = out["n_diverged"], out["counts"]
    if n == 0:
        out["sentence"] = "no output differs from the reference: nothing to attribute."
    else:
        causes = ", ".join(f"{c} ×{k}" for c, k in out["causes"].items())
        out["sentence"] = (
            f"{counts.get('rule', 0)} of {n} first divergences are at a decision of the "
            f"relaxed rule ({causes or 'none'}); {counts.get('numerics', 0)} are numerical."
        )
    return Attribution(**out)


def loglik_facts(rel_dir: str, ref_dir: str, *, alpha: float) -> Loglik | None:
    """The paired emitted-token log-likelihood delta (``audit.likelihood.loglik_delta``)."""
    from relaxspec_audit.audit.likelihood import loglik_delta
    from relaxspec_audit.collect import logs

    row = _row_dict(
        loglik_delta(logs.scan([rel_dir], "positions"), logs.scan([rel_dir], "requests"),
                     logs.scan([ref_dir], "positions"), logs.scan([ref_dir], "requests"),
                     alpha=alpha, by=[])
    )  # fmt: skip
    if not row or not row.get("available"):
        return None
    row["sentence"] = (
        f"mean log-likelihood of the emitted tokens under the target: {row['delta']:+.3f} "
        f"nats/token [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}] against the reference "
        f"({row['n_items']} items; negative: text the target finds less likely)"
    )
    return Loglik(**row)


def coupling_facts(
    runs: TaskRuns, row: Mapping[str, Any] | None, *, ni_margin: float, alpha: float = 0.05
) -> Coupling | None:
    """The coupling estimate of one relaxed run (an audit-table row with its folders).

    Finds the ``coupling`` replica of the row's run (same rule, parameters, split, items
    and sampling but another seed) and calls ``coupling_gain`` on the three runs.

    Returns:
        The estimate with its sentence, or None without a replica or a scorer.
    """
    from relaxspec_audit.audit.coupling import coupling_gain
    from relaxspec_audit.collect import logs

    if not row or not row.get("run_dir") or not row.get("reference_dir"):
        return None
    main = runs.table.filter(pl.col("run_dir") == row["run_dir"])
    if main.height == 0:
        return None
    m = main.row(0, named=True)
    replica = runs.coupling_replica(m)
    if replica is None:
        return None
    rel = logs.scan([row["run_dir"]], "requests").collect()
    ref = logs.scan([row["reference_dir"]], "requests").collect()
    ind = logs.scan([replica], "requests").collect()
    if rel["score"].is_null().all():
        return None  # no scorer: nothing for a non-inferiority test to size
    out = plain(
        coupling_gain(rel, ref, ind, ni_margin=ni_margin, alpha=alpha,
                      temperature=m["temperature"])
    )  # fmt: skip
    out["sentence"] = coupling_sentence(out)
    return Coupling(**out)


def coupling_sentence(g: Mapping[str, Any]) -> str:
    """What coupling bought, in one sentence (or why it bought nothing here)."""
    if g.get("note"):
        return str(g["note"])
    n_c, n_i = g.get("items_coupled"), g.get("items_independent")
    if not n_c or not n_i:
        return "coupling: not enough items to size either design"
    what = "discordance" if g.get("measure") == "discordance" else "sd of item differences"
    ratio = n_i / n_c
    return (
        f"with one shared random stream the non-inferiority test needs about {n_c} items per "
        f"split; independently seeded runs would need about {n_i} ({ratio:.1f}×), from the "
        f"{what} {_f(g.get('coupled'))} coupled vs {_f(g.get('independent'))} independent "
        f"on {g.get('n_items')} items"
    )


def _f(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"
