"""What the shared random stream bought this audit, for the sign-off (THEORY §4).

A batch with ``coupling: {seed, limit}`` re-runs each sampled relaxed setting on another
seed (``variant="coupling"``). Paired with the reference on the main seed, that replica
shows what an audit with independently seeded runs would have needed;
:func:`~relaxspec_audit.audit.coupling.coupling_gain` measures both designs on the same
items and this module puts its result in words.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def coupling_facts(
    runs_dir: str | Path, row: Any, *, ni_margin: float, alpha: float = 0.05
) -> dict[str, Any] | None:
    """The coupling estimate of one relaxed run (an ``audit_table`` row with its dirs).

    Finds the ``coupling`` replica of the row's run (same rule, parameters, split, items
    and sampling but another seed) and calls ``coupling_gain`` on the three runs.

    Returns:
        ``coupling_gain``'s dict (JSON-safe) plus ``sentence``, or None without a replica.
    """
    import polars as pl

    from relaxspec_audit.audit.coupling import coupling_gain
    from relaxspec_audit.audit.frames import json_safe
    from relaxspec_audit.collect import logs
    from relaxspec_audit.report.runs import runs_table

    if not row or not row.get("run_dir") or not row.get("reference_dir"):
        return None
    table = runs_table(runs_dir, None, variants=True)
    main = table.filter(pl.col("run_dir") == row["run_dir"])
    if main.height == 0:
        return None
    m = main.row(0, named=True)
    replica = table.filter(
        (pl.col("variant") == "coupling")
        & (pl.col("task") == m["task"])
        & (pl.col("rule") == m["rule"])
        & (pl.col("params") == m["params"])
        & (pl.col("split") == m["split"])
        & (pl.col("seed") != m["seed"])
    )
    if replica.height == 0:
        return None
    rel = logs.scan([row["run_dir"]], "requests").collect()
    ref = logs.scan([row["reference_dir"]], "requests").collect()
    ind = logs.scan([replica["run_dir"][0]], "requests").collect()
    if rel["score"].is_null().all():
        return None  # no scorer: nothing for a non-inferiority test to size
    out = json_safe(
        coupling_gain(rel, ref, ind, ni_margin=ni_margin, alpha=alpha,
                      temperature=m["temperature"])
    )  # fmt: skip
    out["sentence"] = coupling_sentence(out)
    return out


def coupling_sentence(g: dict[str, Any]) -> str:
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
