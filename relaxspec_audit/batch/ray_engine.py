"""The Ray engine: a batch's shards on a Ray cluster, one actor per GPU or CPU worker.

``relaxspec-audit batch CONFIG --engine ray`` (or ``engine: ray`` in the config) hands
collection to :class:`RayEngine`. The batch is cut into shards (``batch.shards``: task ×
setting × split × request chunk); a pool of actors pulls them from one queue. An actor
loads a model pair once and keeps it for every later shard of that pair (shards come in
config order). Each shard writes its own writer namespace of its run folder under its own
lease; a run's manifest is finished by this driver once all its shards are done, so no
shard marks a run complete that others are still writing. Above the shards the driver (or
``run_batch`` for it) owns every local run for the batch (``lease.hold_runs``): a second
batch or collect on one is refused, and a shard checks before each commit that its driver
still owns the run (``lease.check_owner``).

Faults: an actor that dies (its process killed, its node lost) fails its shard with
``RayActorError``; the shard goes back to the queue for a fresh actor, which resumes the
shard's committed chunks and drops its uncommitted parts, so every request is logged
exactly once. A worker lost on another host leaves a lease this host cannot prove dead;
the retry waits for its heartbeat to go stale (``LEASE_TIMEOUT_S``) before taking it.
A shard that raises an ordinary error (bad input, a decode error) is not retried: its
run is reported failed, as with the local engine. Cost calibration and the paired
wall-clock timing pass run on one actor, so their clocks see one worker's device.

The runs root is a folder every actor can write (one machine, or a shared file system),
or an S3-compatible object store (``s3://bucket/prefix``, ``collect.storage``): there a
shard writes a local staging folder and pushes each commit, parts first and the commit
record last, so on the store too a chunk counts once its record exists.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit.batch.plan import TaskPlan
from relaxspec_audit.batch.shards import (
    DEFAULT_SHARD_SIZE,
    ShardSpec,
    has_manifest,
    plan_shards,
    run_location,
)
from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig
from relaxspec_audit.collect.lease import LeaseHeldError, hold_runs, pid_alive
from relaxspec_audit.collect.schema import LEASE_TIMEOUT_S, MANIFEST

#: Torch threads per CPU actor when the caller does not say: two cores per pair keep a
#: real model's matmuls efficient, and each actor holds a whole pair in memory.
CPU_THREADS = 2
#: Retries of a shard whose actor died, before its run is reported failed.
MAX_RETRIES = 2
#: Seconds between tries to take a shard's lease still held by a lost worker.
LEASE_WAIT_S = 15.0
#: Seconds an actor may take to start (placed, its process up) before it is given up.
ACTOR_START_S = 120.0
#: Name prefix of the local staging folders of steps on an object store (``_staging``).
STAGING = "relaxspec-stage-"


def _store(runs: Any) -> Any:
    from relaxspec_audit.collect.storage import Store, parse_store

    return runs if isinstance(runs, Store) else parse_store(runs)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the Ray engine needs ray: pip install 'relaxspec_audit[ray]'") from exc
    return ray


class ShardWorker:
    """A Ray actor's body: decodes shards with one cached pair (see the module docstring).

    Args:
        threads: torch threads of this worker.
        die_after_commits: a test hook: end this process right after its n-th commit
            (deterministic, unlike a timer), as a killed worker would.
    """

    def __init__(self, threads: int, die_after_commits: int | None = None) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        self.die_after_commits = die_after_commits
        self.commits = 0

    def _committed(self, record: Path) -> None:
        self.commits += 1
        if self.die_after_commits is not None and self.commits >= self.die_after_commits:
            os._exit(1)  # as a kill would: no cleanup, the lease left behind

    def run_shard(
        self,
        spec: ShardSpec,
        runs: str,
        options: Mapping[str, Any] | None,
        cost_table: Mapping[str, Any] | None,
        commit_every: int = 16,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Decode one shard; returns its requests, tokens and the decoder's engine info.

        On an object store the shard writes a fresh staging folder: its namespace is
        pulled from the store first (what the store has committed is what it resumes),
        and each commit is pushed, parts first and the record last. ``owner``: the token
        of the driver's owner lease on the run (local roots); each commit checks it first.
        """
        from relaxspec_audit.collect import storage

        store = storage.parse_store(runs, options)
        if store.is_local:
            return self._run_shard(
                spec, store.root, self._committed, cost_table, commit_every, owner
            )
        with _staging("shard") as tmp:
            staging = Path(tmp)
            local_run = staging / spec.run_rel
            storage.pull_namespace(store, spec.run_rel, spec.writer, local_run)

            def push(record: Path) -> None:
                if storage.read_json(store, spec.run_rel, MANIFEST) is None:
                    storage.push_file(store, spec.run_rel, local_run / MANIFEST, MANIFEST)
                storage.push_commit(store, spec.run_rel, local_run, record)
                self._committed(record)

            return self._run_shard(spec, staging, push, cost_table, commit_every)

    def _run_shard(
        self,
        spec: ShardSpec,
        out: Path,
        on_commit: Callable[[Path], None],
        cost_table: Mapping[str, Any] | None,
        commit_every: int,
        owner: str | None = None,
    ) -> dict[str, Any]:
        from relaxspec_audit.batch.pairs import cached_pair
        from relaxspec_audit.collect.run import Shard, collect

        config = RunConfig.from_json(spec.config_json)
        draft = None if config.rule == TARGET_ONLY else config.draft
        pair = cached_pair(config.target, draft, config.device, config.dtype)
        seen: dict[str, Any] = {"tokens": 0, "requests": 0}

        def progress(totals: Mapping[str, Any]) -> None:
            if "engine" in totals:
                seen["engine"] = totals["engine"]
            seen["tokens"], seen["requests"] = totals["tokens"], totals["done"] - totals["skipped"]

        shard = Shard(spec.request_ids, spec.writer, on_commit=on_commit)
        # A worker lost with its node leaves a lease whose PID this host cannot check: it
        # goes stale when its heartbeat is LEASE_TIMEOUT_S old, so wait that long for it.
        deadline = time.monotonic() + LEASE_TIMEOUT_S + LEASE_WAIT_S
        while True:
            try:
                collect(config, out, resume=True, progress=progress, pair=pair,
                        cost_table=cost_table, shard=shard, chunk_size=commit_every,
                        owner=owner)  # fmt: skip
                return seen
            except LeaseHeldError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(LEASE_WAIT_S)

    def calibrate(
        self, configs_json: list[str], runs: str, options: Mapping[str, Any] | None = None
    ) -> dict[str, dict]:
        """The batch's cost tables, measured on this worker (``batch.calibration``)."""
        from relaxspec_audit.batch.calibration import calibrate_batch

        configs = [RunConfig.from_json(c) for c in configs_json]
        with _synced(runs, options, "costs") as root:
            return calibrate_batch(configs, root)

    def time_task(
        self, task: TaskPlan, runs: str, options: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The task's paired timing pass on this worker (``batch.timing``)."""
        from relaxspec_audit.batch.timing import time_task

        with _synced(runs, options, "timing") as root:
            return [p.relative_to(root).as_posix() for p in time_task(task, root)]


def _staging(kind: str) -> tempfile.TemporaryDirectory:
    """A fresh local staging folder for an object-store step, named for its host and PID.

    A worker killed mid-shard never removes its folder (a shard's staging holds its parts
    until pushed), so each new one first removes those of dead processes on this host.
    """
    host, root = socket.gethostname(), Path(tempfile.gettempdir())
    # This host's exactly: host "node" must not read "node-12"'s folders as PID 12's.
    ours = re.compile(rf"{re.escape(STAGING)}{re.escape(host)}-(\d+)-(shard|costs|timing)-.+")
    for path in root.glob(f"{STAGING}{glob.escape(host)}-*"):
        m = ours.fullmatch(path.name)
        if m and not pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{STAGING}{host}-{os.getpid()}-{kind}-")


@contextlib.contextmanager
def _synced(runs: str, options: Mapping[str, Any] | None, folder: str) -> Iterator[Path]:
    """A local runs root for a step that reads and writes ``<runs>/<folder>/``.

    The root itself for a local store; for an object store a staging copy of that folder
    (cost tables, timing records), whose new or changed files are pushed back at the end.
    """
    from relaxspec_audit.collect import storage

    store = storage.parse_store(runs, options)
    if store.is_local:
        yield store.root
        return
    with _staging(folder) as tmp:
        root = Path(tmp)
        before = {}
        for name in storage.list_files(store, folder):
            data = storage.read_bytes(store, folder, name)
            if data is not None:
                (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
                (root / folder / name).write_bytes(data)
                before[name] = data
        yield root
        for path in sorted((root / folder).rglob("*.json")):
            name = path.relative_to(root / folder).as_posix()
            if before.get(name) != path.read_bytes():
                storage.push_file(store, folder, path, name)


class RayEngine:
    """Collects a batch's runs on a Ray cluster (see the module docstring).

    Args:
        address: the cluster (``"auto"``, ``"ray://host:10001"``); None starts a local
            one unless this process is already connected.
        workers: actors in the pool (default: one per GPU when any run is on cuda, else
            the cluster's CPUs over ``threads``).
        threads: torch threads per CPU actor (default :data:`CPU_THREADS`, capped by the
            cluster's CPUs).
        shard_size: requests per shard.
        commit_every: finished requests per committed chunk within a shard (what a
            killed worker can lose).
        max_retries: retries of a shard whose actor died.
        die_after_commits: test hook: the first actor ends its process after that many
            commits (its replacement does not).
    """

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        threads: int | None = None,
        shard_size: int = DEFAULT_SHARD_SIZE,
        commit_every: int = 16,
        max_retries: int = MAX_RETRIES,
        die_after_commits: int | None = None,
    ) -> None:
        for name, value in (("workers", workers), ("threads", threads)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: must be >= 1, got {value!r}")
        self.address = address
        self.workers = workers
        self.threads = threads
        self.shard_size = shard_size
        self.commit_every = commit_every
        self.max_retries = max_retries
        self.die_after_commits = die_after_commits
        self._actors: list[Any] = []
        self._gpu = False
        self.retries = 0

    # ------------------------------------------------------------------ the actor pool

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        return ray

    def _pool(self, configs: Sequence[RunConfig]) -> list[Any]:
        """Start the actors once (one per GPU for cuda runs, else per CPU worker)."""
        if self._actors:
            return self._actors
        ray = self._connect()
        resources = ray.cluster_resources()
        self._gpu = any(c.device.startswith("cuda") for c in configs)
        if self._gpu:
            n = self.workers or int(resources.get("GPU", 0))
            if n < 1:
                raise RuntimeError("runs on cuda, but the Ray cluster has no GPU")
            self._options = {"num_gpus": 1, "num_cpus": 1}
            threads = self.threads or 1
        else:
            cpus = max(1, int(resources.get("CPU", 1)))
            threads = self.threads or min(CPU_THREADS, cpus)
            n = self.workers or max(1, cpus // threads)
            self._options = {"num_cpus": threads}
        self._threads = threads
        started = [self._new_actor(i == 0) for i in range(n)]
        self._actors = self._ready(started)
        if not self._actors:
            raise RuntimeError(
                f"none of {n} Ray actors ({self._options}) started within {ACTOR_START_S:.0f} s: "
                "the cluster cannot place them (ask for fewer --workers or threads)"
            )
        return self._actors

    def _ready(self, actors: list[Any]) -> list[Any]:
        """The actors that started within ACTOR_START_S; the others are killed.

        An actor the cluster cannot place (more workers than GPUs or CPUs, a lost node's
        replacement) would otherwise hold its shard forever.
        """
        ray = _ray()
        probes = {a.__ray_ready__.remote(): a for a in actors}
        done, _ = ray.wait(list(probes), num_returns=len(probes), timeout=ACTOR_START_S)
        ok = []
        for ref, actor in probes.items():
            try:
                if ref in done:
                    ray.get(ref)
                    ok.append(actor)
                    continue
            except ray.exceptions.RayError:
                pass
            ray.kill(actor, no_restart=True)
        return ok

    def _new_actor(self, first: bool = False) -> Any:
        ray = _ray()
        hook = self.die_after_commits if first else None
        # max_restarts=0: a dead actor stays dead; the driver gives its shard to a new one.
        cls = ray.remote(max_restarts=0, **self._options)(ShardWorker)
        return cls.remote(self._threads, hook)

    def close(self) -> None:
        """End the actors (the cluster stays up)."""
        ray = _ray()
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    # ------------------------------------------------------------------ the batch's steps

    def calibrate(self, configs: Sequence[RunConfig], runs: str | Path) -> dict[str, dict]:
        """The batch's cost tables, measured on the first actor."""
        ray = _ray()
        store = _store(runs)
        actor = self._pool(configs)[0]
        ref = actor.calibrate.remote([c.to_json() for c in configs], store.url, store.options)
        return ray.get(ref)

    def time_task(self, task: TaskPlan, runs: str | Path) -> list[str]:
        """The task's paired timing pass, on one actor; the records' paths or URLs."""
        ray = _ray()
        store = _store(runs)
        actor = self._pool(list(task.runs))[0]
        names = ray.get(actor.time_task.remote(task, store.url, store.options))
        return [store.join(name) for name in names]

    def collect(
        self,
        configs: Sequence[RunConfig],
        runs_dir: str | Path,
        *,
        cost_tables: Mapping[str, Mapping[str, Any]] | None = None,
        on_done: Callable[[RunConfig, Path, str | None], None] | None = None,
        progress: Callable[[Mapping[str, Any]], None] | None = None,
        owners: Mapping[str, str] | None = None,
    ) -> dict[str, tuple[Path, str | None]]:
        """Collect every missing request of ``configs``; the local engine's contract.

        Args:
            configs: validated run configs.
            runs_dir: the runs root: a folder every actor can write, or an ``s3://`` URL
                (``collect.storage``; options from the ``AWS_*`` environment).
            cost_tables: ``{config.to_json(): table}`` for the manifests.
            on_done: called once per run, when its last shard ends, with (config, run
                folder, error or None).
            progress: called after each shard with ``shards_done``, ``shards``,
                ``requests``, ``tokens``, ``workers`` and ``retries`` over the cluster.
            owners: ``{config.to_json(): owner-lease token}`` when the caller owns the runs
                (``run_batch``); None: this call owns every local run itself.

        Returns:
            ``{config.to_json(): (run folder or URL, error or None)}``.

        Raises:
            LeaseHeldError: another live collect or batch owns one of the runs (local
                runs roots only: a store has no lock); nothing is decoded.
        """
        store = _store(runs_dir)
        with contextlib.ExitStack() as held:
            if owners is None:  # the driver owns every local run; its shards work for it
                local = {c.to_json(): run_location(store, c) for c in configs if store.is_local}
                tokens = held.enter_context(hold_runs(local.values()))
                owners = {key: tokens[path] for key, path in local.items()}
            unowned = [
                run_location(store, c)
                for c in configs
                if store.is_local and c.to_json() not in owners
            ]
            if unowned:  # its shards would write with no owner check
                raise ValueError(f"owners: no owner token for run {unowned[0]}")
            try:
                return self._collect(configs, store, cost_tables, on_done, progress, owners)
            except BaseException:  # no actor may write on once the runs are released
                with contextlib.suppress(Exception):  # the original error is the one to see
                    self.close()
                raise

    def _collect(
        self,
        configs: Sequence[RunConfig],
        store: Any,
        cost_tables: Mapping[str, Mapping[str, Any]] | None,
        on_done: Callable[[RunConfig, Path, str | None], None] | None,
        progress: Callable[[Mapping[str, Any]], None] | None,
        owners: Mapping[str, str],
    ) -> dict[str, tuple[Path, str | None]]:
        from relaxspec_audit.collect.reader import (
            finished_request_ids,
            read_manifest,
            verify_run,
        )
        from relaxspec_audit.collect.writer import finish_manifest

        ray = _ray()
        shards, wanted = plan_shards(configs, store, self.shard_size)
        by_run = {c.to_json(): c for c in configs}
        left = {key: sum(s.config_json == key for s in shards) for key in by_run}
        planned = dict(left)
        errors: dict[str, str] = {}
        engines: dict[str, tuple[int, Any]] = {}  # the engine of the largest shard
        retried: dict[str, int] = {}
        out: dict[str, tuple[Path, str | None]] = {}
        totals = {"shards_done": 0, "shards": len(shards), "requests": 0, "tokens": 0}

        def finish(key: str) -> None:
            config = by_run[key]
            run_dir = run_location(store, config)
            error = errors.get(key)
            try:
                if not has_manifest(store, config):
                    error = error or f"{run_dir}: no run was written"
                else:
                    missing = set(wanted[key]) - finished_request_ids(run_dir)
                    if error is None and missing:
                        error = f"{len(missing)} requests missing after every shard ended"
                    if error is None:
                        # Parts outside every record (another namespace's leftovers, e.g.
                        # a local run killed mid-chunk) would make a complete run unreadable.
                        verify_run(run_dir, complete=True)
            except Exception as exc:
                error = error or f"{type(exc).__name__}: {exc}"
            try:
                if has_manifest(store, config):
                    status = "complete" if error is None else "failed"
                    extra = {"cluster": self._cluster_info(planned[key], retried.get(key, 0))}
                    if key in engines:
                        extra["engine"] = engines[key][1]
                    if read_manifest(run_dir).status != status or key in engines:
                        finish_manifest(run_dir, status, **extra)
            except Exception as exc:
                error = error or f"{type(exc).__name__}: {exc}"
            out[key] = (run_dir, error)
            if on_done is not None:
                on_done(config, run_dir, error)

        for key, n in left.items():  # nothing to do: finish (or re-finish) it now
            if n == 0:
                finish(key)
        if not shards:
            return out
        actors = self._pool(configs)
        queue: deque[tuple[ShardSpec, int]] = deque((s, 0) for s in shards)
        idle = list(actors)
        running: dict[Any, tuple[Any, ShardSpec, int]] = {}
        while queue or running:
            while queue and idle:
                spec, attempt = queue.popleft()
                if spec.config_json in errors:  # its run already failed: do not go on
                    self._shard_ended(spec, left, finish)
                    continue
                actor = idle.pop()
                table = (cost_tables or {}).get(spec.config_json)
                ref = actor.run_shard.remote(
                    spec, store.url, store.options, table, self.commit_every,
                    owners.get(spec.config_json),
                )  # fmt: skip
                running[ref] = (actor, spec, attempt)
            if not running:
                continue
            (ref,), _ = ray.wait(list(running), num_returns=1)
            actor, spec, attempt = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the shard's own error: not retried
                idle.append(actor)
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                errors.setdefault(spec.config_json, f"{type(cause).__name__}: {cause}")
            except ray.exceptions.RayError as exc:  # the worker is lost (died, unreachable)
                # Kill it for sure (an unreachable actor may come back and go on writing)
                # before its shard goes to a fresh one.
                ray.kill(actor, no_restart=True)
                actors.remove(actor)
                fresh = self._ready([self._new_actor()])
                actors.extend(fresh)
                idle[:0] = fresh  # running actors take the retried shard first (idle.pop())
                if attempt < self.max_retries and actors:
                    self.retries += 1
                    retried[spec.config_json] = retried.get(spec.config_json, 0) + 1
                    queue.appendleft((spec, attempt + 1))
                    continue
                why = "no worker left" if not actors else f"worker lost: {exc}"
                errors.setdefault(spec.config_json, f"shard {spec.name}: {why}")
                if not actors:  # nothing can run the rest: fail every remaining run
                    while queue:
                        rest, _ = queue.popleft()
                        errors.setdefault(rest.config_json, "no worker left")
                        totals["shards_done"] += 1
                        self._shard_ended(rest, left, finish)
            else:
                idle.append(actor)
                # A retried shard whose requests were all committed decodes nothing (and
                # reports the generic engine): the run's engine is its largest shard's.
                n = result["requests"]
                if n and n > engines.get(spec.config_json, (0, None))[0]:
                    engines[spec.config_json] = (n, result.get("engine"))
                totals["requests"] += result["requests"]
                totals["tokens"] += result["tokens"]
            totals["shards_done"] += 1
            if progress is not None:
                progress({**totals, "workers": len(actors), "retries": self.retries})
            self._shard_ended(spec, left, finish)
        return out

    @staticmethod
    def _shard_ended(spec: ShardSpec, left: dict[str, int], finish: Callable[[str], None]) -> None:
        left[spec.config_json] -= 1
        if left[spec.config_json] == 0:
            finish(spec.config_json)

    def _cluster_info(self, n_shards: int, retries: int) -> dict[str, Any]:
        return {
            "engine": "ray",
            "workers": len(self._actors),
            "threads": getattr(self, "_threads", None),
            "gpu": self._gpu,
            "shard_size": self.shard_size,
            "shards": n_shards,
            "retries": retries,
        }
