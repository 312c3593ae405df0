"""Collect one run: every item of a task decoded and scored, written as a resumable run folder.

The driver of the collect stage (DESIGN "Logs"): it validates the :class:`RunConfig`, loads
the task and the model pair, writes the manifest (config, run id, θ grid, models, task,
EOS ids) and hands each decoded, scored request to ``logs.RunWriter``. The request id is
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
from relaxspec_audit.collect.logs import RequestRows
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

    Args:
        config: the run configuration (validated here).
        out: parent folder of runs (``runs/``).
        resume: keep and skip finished requests of an earlier, interrupted run.
        progress: called after each request (and once at the start) with a dict of
            ``done``, ``total``, ``tokens``, ``passes``, ``accepted``, ``drafted``, ``wall_s``;
            the first call also has ``engine`` (which engine runs, its batch size and the
            bytes of its preallocated KV caches).
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
    from relaxspec_audit.collect.logs import RunWriter

    config.validate()
    task = tasks.load_task(config.task, split=config.split, limit=config.limit)
    run_dir = config.run_dir(out)
    # One owner per run: this collect, or the batch driver that planned it (`owner`).
    with contextlib.ExitStack() as owned:
        if owner is None and shard is None:
            owner = owned.enter_context(hold_run(run_dir)).token
        elif owner is not None:
            check_owner(run_dir, owner)
        inputs = bind_inputs(config, task, run_dir, resume)  # refuse a mixed resume
        samples = _sample_requests(task.items, config.samples_per_item)
        done = _complete(run_dir, samples.keys()) if resume and shard is None else None
        if done is not None:
            # Nothing to decode: reopening the writer would restamp the manifest (engine,
            # git commit, end time) with this process's facts instead of the ones that made
            # it. A run made before cost tables existed still gains the one it is given.
            if cost_table is not None and done.get("cost_table") is None:
                write_manifest(run_dir, {**done, "cost_table": dict(cost_table)})
            return run_dir
        if pair is None:
            draft = None if config.rule == TARGET_ONLY else config.draft
            pair = load_pair(
                config.target, draft, config.device, config.dtype,
                allow_untokenized_draft=allow_untokenized_draft,
            )  # fmt: skip
        # Every prompt must fit the models' context with room for the output and one block,
        # checked before anything is written.
        encoded = {item.id: encode_prompt(pair, item.prompt) for item in task.items}
        k = 0 if config.rule == TARGET_ONLY else config.k
        check_prompts_fit(pair, list(encoded.items()), config.max_new_tokens, k)
        if shard is not None:
            unknown = sorted(set(shard.request_ids) - samples.keys())
            if unknown:
                raise ValueError(f"shard {shard.writer}: requests not in the run: {unknown[:5]}")
            samples = {rid: samples[rid] for rid in shard.request_ids}
        if calibrate and cost_table is None:
            cost_table = _calibrated(pair, config, out, allow_untokenized_draft)
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
        totals = {"done": 0, "total": len(samples), "tokens": 0, "passes": 0}
        totals.update(accepted=0, drafted=0, wall_s=0.0, skipped=0)
        own: dict[str, Any] = {}
        if shard is not None:
            own.update(writer=shard.writer, owns_manifest=False, on_commit=shard.on_commit)
        if owner is not None:  # every commit first checks that the owner still holds the run
            own["before_commit"] = functools.partial(check_owner, run_dir, owner)
        with RunWriter(run_dir, manifest, resume=resume, chunk_size=chunk_size, **own) as writer:
            todo = {rid: item for rid, item in samples.items() if rid not in writer.finished}
            totals["skipped"] = totals["done"] = len(samples) - len(todo)
            requests = [(rid, encoded[item.id]) for rid, item in todo.items()]
            stops = StopStrings(pair.tokenizer, task.stop) if task.stop else None
            decoded, engine = _decoder(pair, config, requests, stops)
            # Which engine ran, and the KV cache it preallocated, before any decoding.
            if engine is not None:
                writer.update_manifest(engine=engine)
            if progress is not None:
                progress({**totals, "engine": engine} if engine is not None else dict(totals))
            for rows in decoded:
                item = todo[rows.request_id]
                text = pair.tokenizer.decode(rows.request["output_ids"], skip_special_tokens=True)
                rows.request.update(
                    item_id=item.id,
                    task=task.name,
                    split=item.split,
                    text=text,
                    score=task.score(item, text),
                )
                writer.add(rows)
                totals["done"] += 1
                totals["tokens"] += rows.request["n_tokens"]
                totals["passes"] += rows.request["target_passes"]
                totals["accepted"] += int(sum(rows.rounds["accepted"]))
                totals["drafted"] += int(sum(rows.rounds["k"]))
                totals["wall_s"] += rows.request["wall_s"]
                if progress is not None:
                    progress(dict(totals))
        return run_dir


def _complete(run_dir: Path, request_ids: Iterable[str]) -> dict[str, Any] | None:
    """The manifest of a run marked complete that holds every one of ``request_ids``."""
    from relaxspec_audit.collect.logs import LogError, finished_request_ids, read_manifest

    try:  # read_manifest refuses another schema version: the writer then says so
        manifest = read_manifest(run_dir)
    except (LogError, OSError, ValueError):
        return None
    done = manifest.get("status") == "complete"
    return manifest if done and set(request_ids) <= finished_request_ids(run_dir) else None


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


def _decoder(
    pair: Pair,
    config: RunConfig,
    requests: list[tuple[str, list[int]]],
    stops: StopStrings | None,
) -> tuple[Iterator[RequestRows], dict[str, Any] | None]:
    """The decoded rows of ``requests`` (lazily) and what the manifest records of the engine.

    One engine (``collect.batched``) for every pair, through the model adapter it chooses;
    nothing to decode builds none (None: no record).
    """
    from relaxspec_audit.collect.batched import open_engine

    if not requests:
        return iter(()), None
    engine = open_engine(pair, config, requests, stops)
    return engine.run(requests), engine.record
