"""The batch's cost tables: one short calibration per (pair, device, dtype, K, batch size).

The modelled speed-up (docs/STATISTICS.md §7) multiplies each run's integer pass counts by
one measured cost table, so runs compared with each other must carry the SAME table: a
batch calibrates once per key before collecting, stores the table under
``<runs>/costs/<id>.json`` (a resumed batch finds and reuses it) and hands it to every run
of that key, target-only runs included (they read its one-token target step; they have
no K of their own, so they take the K of the task's speculative runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig
from relaxspec_audit.collect.costs import planned_batch_size


def _key(config: RunConfig, k: int) -> tuple:
    return (config.target, config.draft, config.device, config.dtype, k, planned_batch_size(config))


def calibrate_batch(configs: Sequence[RunConfig], runs_dir: str | Path) -> dict[str, dict]:
    """A cost table for every run of a batch, as ``{config.to_json(): table dict}``.

    Speculative runs are keyed by (target, draft, device, dtype, K, batch size); a
    target-only run takes the table of a speculative run with its target, device, dtype
    and batch size (the first such K), else its own config's K. Tables already stored
    under ``runs_dir`` for a key are reused (:func:`~relaxspec_audit.collect.costs.
    find_or_calibrate`).
    """
    from relaxspec_audit.batch.pairs import cached_pair
    from relaxspec_audit.collect.costs import find_or_calibrate

    spec_k: dict[tuple, int] = {}
    for c in configs:
        if c.rule != TARGET_ONLY:
            spec_k.setdefault((c.target, c.device, c.dtype, planned_batch_size(c)), c.k)
    keys: dict[str, tuple] = {}
    for c in configs:
        k = c.k
        if c.rule == TARGET_ONLY:
            k = spec_k.get((c.target, c.device, c.dtype, planned_batch_size(c)), c.k)
        keys[c.to_json()] = _key(c, k)
    tables: dict[tuple, dict[str, Any]] = {}
    for key in dict.fromkeys(keys.values()):
        target, draft, device, dtype, k, b = key
        pair = cached_pair(target, draft, device, dtype)
        tables[key] = find_or_calibrate(runs_dir, pair, k, b).to_dict()
    return {cfg: tables[key] for cfg, key in keys.items()}
