"""Log tables as polars frames: the frame type, the cluster key, runs, plain JSON values.

Every audit statistic (THEORY §3) takes polars frames (``DataFrame`` or ``LazyFrame``) of
the log tables (docs/ARCHITECTURE.md, "Logs") and returns a small tidy ``DataFrame``.
Observations are clustered by request (positions of one request share a prompt, a
prefix and a random stream), so every statistic on positions requires the cluster key
:data:`CLUSTER` (``request_id``): :func:`_lazy` refuses a frame that lacks a needed
column and names the cluster key when it is the one missing (as inspect_ai refuses
samples without a cluster id; Miller 2024, "Adding Error Bars to Evals", App. A).

This module also loads the tables of runs (:class:`RunFrames`), reads what the runs'
manifests share (the ``es`` θ grid, the run's θ), and turns results into plain JSON
values (:func:`json_safe`: numpy scalars become Python, non-finite floats become None).

Only numpy and polars are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from relaxspec_audit.collect.manifest import RunManifest

#: The cluster key of every clustered statistic (one cluster per request).
CLUSTER = "request_id"

#: A log table, eager or lazy; every statistic accepts either.
Frame = pl.DataFrame | pl.LazyFrame
#: Draft positions a statistic counts: those the rule decided on, or all of them.
Scope = Literal["reached", "all"]


def _lazy(frame: Frame, name: str, required: Iterable[str]) -> pl.LazyFrame:
    """Lazy view of ``frame`` after checking that ``required`` columns exist."""
    if isinstance(frame, pl.DataFrame):
        lf = frame.lazy()
    elif isinstance(frame, pl.LazyFrame):
        lf = frame
    else:
        raise TypeError(f"{name}: expected a polars DataFrame or LazyFrame, got {type(frame)}")
    have = set(lf.collect_schema().names())
    missing = [c for c in required if c not in have]
    if missing:
        hint = ""
        if CLUSTER in missing:
            hint = f" ({CLUSTER!r} is the cluster key of every clustered statistic)"
        raise ValueError(f"{name}: missing column(s) {missing}{hint}; have {sorted(have)}")
    return lf


def _draft_rows(lf: pl.LazyFrame, scope: Scope) -> pl.LazyFrame:
    """Draft positions; ``reached`` drops ``not_reached`` rows (never decided on)."""
    if scope not in ("reached", "all"):
        raise ValueError(f"scope: must be 'reached' or 'all', got {scope!r}")
    lf = lf.filter(pl.col("kind") == "draft")
    if scope == "reached":
        lf = lf.filter(pl.col("cause") != "not_reached")
    return lf


def json_safe(x: Any) -> Any:
    """JSON-safe value: non-finite floats become None, numpy scalars become Python."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _records(df: pl.DataFrame, cols: Sequence[str]) -> list[dict[str, Any]]:
    return json_safe(df.select(cols).to_dicts())


@dataclass
class RunFrames:
    """The three log tables of one or more runs, their manifests, and which were unverified.

    ``unverified`` lists the run folders whose logs were read without checking them: every
    run when loaded with ``verify=False``.
    """

    positions: Frame
    rounds: Frame
    requests: Frame
    manifests: list[RunManifest]
    unverified: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, paths: str | Path | Iterable[str | Path], verify: bool = True) -> RunFrames:
        """Lazy scans of run folders (or parents of run folders) via ``logs.scan``.

        Args:
            paths: run folders or their parents.
            verify: check each committed chunk first (``logs.verify_run``); False skips it.

        Raises:
            LogError: a damaged or inconsistent log (when verifying), naming the file.
        """
        from relaxspec_audit.collect import logs

        runs = logs.find_runs(paths)
        return cls(
            positions=logs.scan(runs, "positions", verify=verify),
            rounds=logs.scan(runs, "rounds", verify=verify),
            requests=logs.scan(runs, "requests", verify=verify),
            manifests=[logs.read_manifest(r) for r in runs],
            unverified=[] if verify else [str(r) for r in runs],
        )

    @property
    def verified(self) -> bool:
        """True when every run's logs were checked against their commit records."""
        return not self.unverified

    @property
    def theta_grid(self) -> tuple[float, ...]:
        """The θ grid the runs logged ``es`` on (their manifests'), else the default grid."""
        from relaxspec_audit.collect.config import DEFAULT_THETA_GRID

        return _manifest_grid(self.manifests) or DEFAULT_THETA_GRID


def _manifest_grid(manifests: Sequence[RunManifest]) -> tuple[float, ...] | None:
    """The runs' common ``es`` θ grid, or None without runs; differing grids are an error."""
    grids = {m.theta_grid for m in manifests}
    if len(grids) > 1:
        raise ValueError(f"runs: different es theta grids in their manifests: {sorted(grids)}")
    return grids.pop() if grids else None


def nsd_theta(manifests: Sequence[RunManifest]) -> float | None:
    """The runs' common nucleus θ, where deviation accounting applies to every run.

    The ``(1 − ε)^T`` bound is NSD's (THEORY §2.3: TV(P, p) = E_S where θ is a nucleus
    mass), so it applies only to rules registered with ``NSD_DEVIATION``: not to ``margin``
    (a logit ratio), ``asd`` or the lossless references. None when any run's rule lacks
    it, or the runs disagree on θ.
    """
    thetas = {m.nucleus_theta for m in manifests}
    if None in thetas:
        return None
    return thetas.pop() if len(thetas) == 1 else None
