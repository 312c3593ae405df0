"""The fidelity evidence beside a verdict: the noise floor, where outputs changed, likelihood.

An audit that blames the relaxed rule for divergence the lossless decoder shows by itself
misleads its reader (docs/STATISTICS.md "Noise floor"). Per relaxed family this module
gathers, from the logs:

* the **greedy floor**: strict greedy speculative decoding against target-only decoding at
  T = 0 on the same items — lossless, so any difference is numerical;
* the **numeric floor**: the reference against its ``noise_floor`` replica (another batch
  size or dtype), when the batch ran one;
* the **attribution** of every first divergence between the relaxed run and its reference:
  at a decision of the relaxed rule, or not (numerics);
* the **likelihood** delta: mean log-likelihood per emitted token under the untransformed
  target, relaxed − reference — the fidelity measure of an open-ended task beyond
  divergence.

Each block is computed by :mod:`relaxspec_audit.audit` and put in words here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _row_dict(frame: Any) -> dict[str, Any] | None:
    from relaxspec_audit.audit.frames import json_safe

    return json_safe(frame.row(0, named=True)) if frame is not None and frame.height else None


def greedy_floor_facts(greedy_dir: str, target_dir: str, *, alpha: float) -> dict[str, Any]:
    """The greedy-family floor between two run folders (``audit.noise.greedy_floor``)."""
    from relaxspec_audit.audit.noise import floor_sentence, greedy_floor
    from relaxspec_audit.collect import logs

    row = _row_dict(
        greedy_floor(logs.scan([greedy_dir], "requests"), logs.scan([target_dir], "requests"),
                     alpha=alpha, by=[])
    )  # fmt: skip
    row = row or {"n": 0, "n_diverged": 0}
    row["sentence"] = floor_sentence(int(row["n_diverged"]), int(row["n"]))
    return row


def numeric_floor_facts(main_dir: str, replica_dir: str, *, alpha: float) -> dict[str, Any]:
    """The numeric floor between a reference run and its replica (``audit.noise``)."""
    from relaxspec_audit.audit.frames import json_safe
    from relaxspec_audit.audit.noise import floor_sentence, numeric_floor

    out = json_safe(numeric_floor(main_dir, replica_dir, alpha=alpha))
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
    return out


def attribution_facts(rel_dir: str, ref_dir: str, rule: str, *, alpha: float) -> dict[str, Any]:
    """Where and why the relaxed run's outputs first left the reference's."""
    from relaxspec_audit.audit.attribution import attribute_divergence, attribution_summary
    from relaxspec_audit.collect import logs

    rel_req = logs.scan([rel_dir], "requests").collect()
    ref_req = logs.scan([ref_dir], "requests").collect()
    # typical and fuzzy resample from their own residual: their recoveries are the rule's.
    att = attribute_divergence(logs.scan([rel_dir], "positions"), rel_req, ref_req, by=[],
                               rule_recovery=rule in ("typical", "fuzzy"))  # fmt: skip
    from relaxspec_audit.audit.pairing import pair_requests

    n_pairs = pair_requests(rel_req, ref_req, ["n_tokens"], by=[]).height
    out = attribution_summary(att, n_pairs=n_pairs, alpha=alpha)
    n, counts = out["n_diverged"], out["counts"]
    if n == 0:
        out["sentence"] = "no output differs from the reference: nothing to attribute."
    else:
        causes = ", ".join(f"{c} ×{k}" for c, k in out["causes"].items())
        out["sentence"] = (
            f"{counts.get('rule', 0)} of {n} first divergences are at a decision of the "
            f"relaxed rule ({causes or 'none'}); {counts.get('numerics', 0)} are numerical."
        )
    return out


def loglik_facts(rel_dir: str, ref_dir: str, *, alpha: float) -> dict[str, Any] | None:
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
    return row


def floor_facts(
    runs_dir: str | Path, row: Mapping[str, Any], table: Any, *, alpha: float
) -> dict[str, Any]:
    """The noise floor of one family: greedy floor (T = 0) and/or the numeric floor.

    Args:
        runs_dir: folder of run folders (replicas included).
        row: the shown setting's ``audit_table`` row (with ``run_dir``/``reference_dir``).
        table: the task's ``runs_table`` (main runs).
        alpha: 1 − confidence level.

    Returns:
        ``{"greedy": {...} | None, "numeric": [{variant, ...}, ...], "sentence", "short"}``
        (one numeric block per ``noise_floor`` replica of the reference).
    """
    import polars as pl

    from relaxspec_audit.report.runs import _baseline, runs_table

    ref_dir = row.get("reference_dir")
    out: dict[str, Any] = {"greedy": None, "numeric": []}
    main = table.filter(pl.col("run_dir") == ref_dir)
    ref = main.row(0, named=True) if main.height else None
    if ref is not None and ref["rule"] == "greedy":
        base = _baseline(table, ref)
        hit = table.filter(pl.col("run_dir") == base) if base else None
        if hit is not None and hit.height and hit["temperature"][0] == 0:
            out["greedy"] = greedy_floor_facts(ref_dir, base, alpha=alpha)
    if ref is not None:
        # Each replica decodes the reference on its own split (discovery) with one thing
        # changed (batch size or dtype); its twin is the main run of that rule with the
        # same items, seed and sampling (the `_pair` key), whatever the shown split.
        every = runs_table(runs_dir, ref["task"], variants=True)
        replicas = every.filter(
            pl.col("variant").str.starts_with("floor-") & (pl.col("rule") == ref["rule"])
        )
        for rep in replicas.iter_rows(named=True):
            twin = table.filter((pl.col("rule") == rep["rule"]) & (pl.col("_pair") == rep["_pair"]))
            if twin.height:
                block = numeric_floor_facts(twin["run_dir"][0], rep["run_dir"], alpha=alpha)
                out["numeric"].append({"variant": rep["variant"], **block})
    blocks = [b for b in (out["greedy"], *out["numeric"]) if b]
    parts = [b["sentence"] for b in blocks]
    out["sentence"] = (
        " ".join(parts)
        if parts
        else (
            "not measured: the batch ran no target-only greedy run nor a noise_floor replica "
            "for this reference"
        )
    )
    shorts = [f"{b['n_diverged']}/{b['n']}" for b in blocks]
    out["short"] = " · ".join(shorts) if shorts else None
    return out
