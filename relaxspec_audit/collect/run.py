"""Collect one run: every item of a task decoded and scored, written as a resumable run folder.

The driver of the collect stage (docs/ARCHITECTURE.md "Logs"). :func:`collect` reads as a
recipe, each step one call into the module that owns it: hold the run (``lease``), bind its inputs
(``inputs``), load the pair and check every prompt against it (``pair``), calibrate
(``costs``), open the writer (``logs.RunWriter``: the manifest with config, run id, θ grid,
models, task, EOS ids), decode (``batched``, the one engine) and finish. The request id is
the task item's id (``f"{item_id}#{j}"`` for sample ``j ≥ 1`` when ``samples_per_item >
1``), so runs of different rules on one seed share each request's random stream (THEORY
§4), and finished requests (samples) of an interrupted run are skipped on resume.

torch and transformers are imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig, sample_request_id
from relaxspec_audit.collect.inputs import bind_inputs
from relaxspec_audit.collect.lease import check_owner, hold_run
from relaxspec_audit.collect.pair import Pair, check_prompts_fit, encode_prompt, load_pair
from relaxspec_audit.collect.stops import StopStrings
from relaxspec_audit.collect.writer import write_manifest


def collect(
    config: RunConfig,
    out: str | Path,
    resume: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
    pair: Pair | None = None,
    chunk_size: int = 16,
    allow_untokenized_draft: bool = False,
    cost_table: Mapping[str, Any] | None = None,
    calibrate: bool = False,
    shard: Shard | None = None,
    owner: str | None = None,
) -> Path:
    """Decode every item of the config's task and write the run folder under ``out``.

    Finished requests of an existing run folder are skipped (``resume``); the task scorer
    grades each completion. The request id is the task item's id, so runs of different
    rules on one seed share each request's random stream (THEORY §4); with
    ``config.samples_per_item = n > 1`` each item is decoded n times, sample ``j`` under
    request id :func:`~relaxspec_audit.collect.config.sample_request_id` (``item`` for
    j = 0, ``item#j`` after), each with its own stream; ``item_id`` stays the item's id.

    The steps, each one call: hold the run, bind its inputs, load the pair (every prompt
    checked against it), calibrate, open the writer, decode, finish (the writer's exit
    marks the manifest). Every input is checked before the writer opens: opening it writes
    the manifest (and, without ``resume``, clears the folder), so bad input writes nothing.

    Args:
        config: the run configuration (validated here).
        out: parent folder of runs (``runs/``).
        resume: keep and skip finished requests of an earlier, interrupted run.
        progress: called after each request (and once at the start) with a dict of
            ``done``, ``total``, ``tokens``, ``passes``, ``accepted``, ``drafted``, ``wall_s``;
            the first call also has ``engine`` (which engine runs, its batch size and the
            bytes of its preallocated KV caches) when anything is left to decode.
        pair: an already loaded pair (default: :func:`load_pair` of the config's models).
        chunk_size: finished requests per committed Parquet part.
        allow_untokenized_draft: load a draft folder that has no tokenizer files (its
            vocabulary then cannot be checked against the target's).
        cost_table: a cost table (draft step, verify pass, target step; built by the
            calibration helper) stored as the manifest's ``cost_table``.
        calibrate: without ``cost_table``, find or measure one for this pair, device,
            dtype, K and batch size under ``out/costs/`` (after every input check, so bad
            input writes nothing); a target-only run is calibrated with the config's
            draft and K, the table its speculative runs carry.
        shard: decode only these requests, in this writer namespace, leaving the
            manifest's status to the scheduler (:class:`Shard`; None: the whole run).
        owner: the token of the run's owner lease when a batch driver holds it (a shard's
            or a batch's collect works for it, and stops if it is lost); None: a whole run
            takes its own (``lease.hold_run``), a shard on an object store has none.

    Returns:
        The run folder.
    """
    from relaxspec_audit import tasks

    config.validate()  # resolved once: every step below reads this config
    task = tasks.load_task(config.task, split=config.split, limit=config.limit)
    run_dir = config.run_dir(out)
    samples = _sample_requests(task.items, config.samples_per_item)
    with _held(run_dir, owner, shard) as owner:
        inputs = bind_inputs(config, task, run_dir, resume)  # refuse a mixed resume
        done = _complete(run_dir, samples.keys()) if resume and shard is None else None
        if done is not None:
            return _keep_complete(run_dir, done, cost_table)
        pair = pair or _load_pair(config, allow_untokenized_draft)
        prompts = _encode_prompts(pair, task, config)
        samples = _in_shard(samples, shard)
        if calibrate and cost_table is None:
            cost_table = _calibrated(pair, config, out, allow_untokenized_draft)
        manifest = _manifest(config, pair, task, inputs, cost_table)
        with _open_writer(run_dir, manifest, resume, chunk_size, shard, owner) as writer:
            _decode(writer, pair, config, task, samples, prompts, progress)
    return run_dir


@contextlib.contextmanager
def _held(run_dir: Path, owner: str | None, shard: Shard | None) -> Iterator[str | None]:
    """One owner per run: this collect (its own lease), or the batch driver that planned it.

    Yields the owner's token (None: a shard on an object store, which has none).
    """
    if owner is None and shard is None:
        with hold_run(run_dir) as lease:
            yield lease.token
        return
    if owner is not None:
        check_owner(run_dir, owner)
    yield owner


def _keep_complete(
    run_dir: Path, manifest: dict[str, Any], cost_table: Mapping[str, Any] | None
) -> Path:
    """A complete run, left as it was written.

    Reopening the writer would restamp the manifest (engine, git commit, end time) with
    this process's facts instead of the ones that made it. A run made before cost tables
    existed still gains the one it is given.
    """
    if cost_table is not None and manifest.get("cost_table") is None:
        write_manifest(run_dir, {**manifest, "cost_table": dict(cost_table)})
    return run_dir


def _load_pair(config: RunConfig, allow_untokenized_draft: bool) -> Pair:
    """The config's pair (no draft for target-only decoding)."""
    draft = None if config.rule == TARGET_ONLY else config.draft
    return load_pair(config.target, draft, config.device, config.dtype,
                     allow_untokenized_draft=allow_untokenized_draft)  # fmt: skip


def _encode_prompts(pair: Pair, task: Any, config: RunConfig) -> dict[str, list[int]]:
    """Item id → prompt token ids, every prompt checked before anything is written.

    A prompt must fit the models' context with room for the output and one block.
    """
    encoded = {item.id: encode_prompt(pair, item.prompt) for item in task.items}
    k = 0 if config.rule == TARGET_ONLY else config.k
    check_prompts_fit(pair, list(encoded.items()), config.max_new_tokens, k)
    return encoded


def _in_shard(samples: dict[str, Any], shard: Shard | None) -> dict[str, Any]:
    """The samples a shard decodes (all of them without a shard)."""
    if shard is None:
        return samples
    unknown = sorted(set(shard.request_ids) - samples.keys())
    if unknown:
        raise ValueError(f"shard {shard.writer}: requests not in the run: {unknown[:5]}")
    return {rid: samples[rid] for rid in shard.request_ids}


def _manifest(
    config: RunConfig,
    pair: Pair,
    task: Any,
    inputs: dict[str, Any],
    cost_table: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What the run folder's manifest records at the start (the writer adds the rest)."""
    manifest = {
        "config": config.to_dict(),
        "run_id": config.run_id(),
        "theta_grid": list(config.theta_grid),
        "models": pair.info,
        "task": {"name": task.name, "n_items": len(task.items), "scorer": task.scorer_name},
        "eos_ids": sorted(pair.eos_ids),
        "inputs": inputs,
    }
    if cost_table is not None:
        manifest["cost_table"] = dict(cost_table)
    return manifest


def _open_writer(
    run_dir: Path,
    manifest: dict[str, Any],
    resume: bool,
    chunk_size: int,
    shard: Shard | None,
    owner: str | None,
) -> Any:
    """The run's writer: a shard's in its own namespace, every commit checking the owner."""
    from relaxspec_audit.collect.logs import RunWriter

    own: dict[str, Any] = {}
    if shard is not None:
        own.update(writer=shard.writer, owns_manifest=False, on_commit=shard.on_commit)
    if owner is not None:  # every commit first checks that the owner still holds the run
        own["before_commit"] = functools.partial(check_owner, run_dir, owner)
    return RunWriter(run_dir, manifest, resume=resume, chunk_size=chunk_size, **own)


def _decode(
    writer: Any,
    pair: Pair,
    config: RunConfig,
    task: Any,
    samples: dict[str, Any],
    prompts: dict[str, list[int]],
    progress: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Decode the samples the writer has not finished, score each and hand it to the writer.

    The engine's record (which model adapter, its batch and KV cache) goes into the
    manifest before any decoding.
    """
    todo = {rid: item for rid, item in samples.items() if rid not in writer.finished}
    totals = {"done": len(samples) - len(todo), "total": len(samples), "tokens": 0,
              "passes": 0, "accepted": 0, "drafted": 0, "wall_s": 0.0}  # fmt: skip
    totals["skipped"] = totals["done"]
    if not todo:
        if progress is not None:
            progress(dict(totals))
        return
    from relaxspec_audit.collect.batched import open_engine

    requests = [(rid, prompts[item.id]) for rid, item in todo.items()]
    stops = StopStrings(pair.tokenizer, task.stop) if task.stop else None
    engine = open_engine(pair, config, requests, stops)
    writer.update_manifest(engine=engine.record)
    if progress is not None:
        progress({**totals, "engine": engine.record})
    for rows in engine.run(requests):
        item = todo[rows.request_id]
        text = pair.tokenizer.decode(rows.request["output_ids"], skip_special_tokens=True)
        rows.request.update(item_id=item.id, task=task.name, split=item.split, text=text,
                            score=task.score(item, text))  # fmt: skip
        writer.add(rows)
        totals["done"] += 1
        totals["tokens"] += rows.request["n_tokens"]
        totals["passes"] += rows.request["target_passes"]
        totals["accepted"] += int(sum(rows.rounds["accepted"]))
        totals["drafted"] += int(sum(rows.rounds["k"]))
        totals["wall_s"] += rows.request["wall_s"]
        if progress is not None:
            progress(dict(totals))


def _complete(run_dir: Path, request_ids: Iterable[str]) -> dict[str, Any] | None:
    """The manifest of a run marked complete that holds every one of ``request_ids``."""
    from relaxspec_audit.collect.logs import LogError, finished_request_ids, read_manifest

    try:  # read_manifest refuses another schema version: the writer then says so
        manifest = read_manifest(run_dir)
    except (LogError, OSError, ValueError):
        return None
    done = manifest.status == "complete"
    if done and set(request_ids) <= finished_request_ids(run_dir):
        return manifest.to_dict()
    return None


@dataclass(frozen=True)
class Shard:
    """A slice of one run that a worker decodes alongside others (``batch.shards``).

    Attributes:
        request_ids: the requests to decode (finished ones are skipped as usual).
        writer: the writer namespace: the shard's own part names and lease.
        on_commit: called with each commit record's path (e.g. to copy it to a store).
    """

    request_ids: tuple[str, ...]
    writer: str
    on_commit: Callable[[Path], None] | None = None


def _sample_requests(items: Any, n: int) -> dict[str, Any]:
    """Request id → task item, ``n`` samples per item in item order.

    Raises:
        ValueError: two requests would share an id (an item id that looks like another
            item's sample, ``a#1`` beside ``a``), which would share one random stream.
    """
    out: dict[str, Any] = {}
    for item in items:
        for j in range(n):
            rid = sample_request_id(item.id, j)
            if rid in out:
                raise ValueError(
                    f"samples_per_item: request id {rid!r} of item {item.id!r} is also "
                    f"{'the id' if out[rid].id == rid else 'a sample id'} of item "
                    f"{out[rid].id!r}; rename the item or use one sample per item"
                )
            out[rid] = item
    return out


def _calibrated(
    pair: Pair, config: RunConfig, out: str | Path, allow_untokenized_draft: bool
) -> dict[str, Any]:
    """The run's cost table from ``out/costs/`` (measured once when none matches)."""
    from relaxspec_audit.collect.costs import find_or_calibrate, planned_batch_size

    if pair.draft is None:  # target-only: price its steps in the table of its pair
        pair = load_pair(config.target, config.draft, config.device, config.dtype,
                         allow_untokenized_draft=allow_untokenized_draft)  # fmt: skip
    return find_or_calibrate(out, pair, config.k, planned_batch_size(config)).to_dict()
