"""Shards: a batch's runs cut into independent pieces of work for a cluster.

A shard is one run's chunk of requests: task × setting × split × request chunk. Chunks
are cut from the run's request ids in task order, so shard ``i`` of a run is the same
requests on every re-run (a larger ``limit`` only adds shards), and its writer namespace
``s<i>`` is the same too: a retried or re-run shard resumes its own committed chunks and
drops its own uncommitted parts (``collect.writer``), so every request is logged exactly
once however often a shard is started. A shard whose requests are all committed is not
planned at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from relaxspec_audit.collect.config import RunConfig
from relaxspec_audit.collect.schema import MANIFEST
from relaxspec_audit.collect.storage import Store, parse_store

#: Requests per shard when the caller does not say: a few batches of a GPU engine, and a
#: few minutes of a CPU worker on a real pair, so a lost shard costs little to redo.
DEFAULT_SHARD_SIZE = 32


@dataclass(frozen=True)
class ShardSpec:
    """One shard: which run, which requests, which writer namespace.

    Attributes:
        config_json: the run's :class:`RunConfig` as JSON (what a worker rebuilds).
        run_rel: the run folder relative to the runs root (``task=…/rule=…/run=…``).
        index: the chunk's position in the run (its namespace is ``s<index>``).
        request_ids: the chunk's request ids, finished ones included.
        todo: how many of them were not yet committed when the batch was planned.
    """

    config_json: str
    run_rel: str
    index: int
    request_ids: tuple[str, ...]
    todo: int

    @property
    def writer(self) -> str:
        """The shard's writer namespace (part names, lease)."""
        return f"s{self.index:04d}"

    @property
    def name(self) -> str:
        """``<run folder>#<namespace>``, for messages and progress."""
        return f"{self.run_rel}#{self.writer}"


def run_request_ids(config: RunConfig) -> list[str]:
    """The request ids a run decodes, in order (every sample of every item)."""
    from relaxspec_audit import tasks
    from relaxspec_audit.collect.run import _sample_requests

    task = tasks.load_task(config.task, split=config.split, limit=config.limit)
    return list(_sample_requests(task.items, config.samples_per_item))


def run_location(store: Store, config: RunConfig) -> Path | str:
    """A run's folder (local store) or URL (object store)."""
    rel = run_rel(config)
    return store.root / rel if store.is_local else store.join(rel)


def run_rel(config: RunConfig) -> str:
    """A run's folder relative to the runs root (``task=…/rule=…/run=…``)."""
    return config.run_dir(Path()).as_posix()


def has_manifest(store: Store, config: RunConfig) -> bool:
    """Whether the run exists in the store (its manifest is written)."""
    if store.is_local:
        return (store.root / run_rel(config) / MANIFEST).is_file()
    return store.fs().exists(store._key(run_rel(config), MANIFEST))


def plan_shards(
    configs: Sequence[RunConfig],
    runs_dir: str | Path | Store,
    shard_size: int = DEFAULT_SHARD_SIZE,
) -> tuple[list[ShardSpec], dict[str, list[str]]]:
    """The shards still to run, and each run's request ids.

    Args:
        configs: validated run configs.
        runs_dir: the runs root (a path, URL or :class:`~relaxspec_audit.collect.storage.
            Store`), read for what is already committed.
        shard_size: requests per shard (≥ 1).

    Returns:
        ``(shards, {config.to_json(): the run's request ids})``; shards in config order,
        then chunk order, so a worker that takes them in turn keeps one pair loaded.

    Raises:
        ValueError: ``shard_size`` < 1.
    """
    from relaxspec_audit.collect.reader import finished_request_ids

    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size: must be an integer >= 1, got {shard_size!r}")
    store = runs_dir if isinstance(runs_dir, Store) else parse_store(runs_dir)
    shards: list[ShardSpec] = []
    wanted: dict[str, list[str]] = {}
    for config in configs:
        ids = run_request_ids(config)
        wanted[config.to_json()] = ids
        rel = run_rel(config)
        done = finished_request_ids(run_location(store, config)) if has_manifest(
            store, config) else set()  # fmt: skip
        for index, start in enumerate(range(0, len(ids), shard_size)):
            chunk = tuple(ids[start : start + shard_size])
            todo = sum(rid not in done for rid in chunk)
            if todo:
                shards.append(ShardSpec(config.to_json(), rel, index, chunk, todo))
    return shards, wanted
