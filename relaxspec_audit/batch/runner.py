"""Batch runner: one validated config → collected runs → executed notebooks → ``reports/``.

The recipe follows papermill's ``execute_notebook`` (STYLE "papermill"): load the config →
validate *all* of it (``batch.validation``) before any work → calibrate one cost table per
(pair, device, dtype, K, batch size) (``batch.calibration``; the modelled speed-up's costs)
→ collect the runs that are missing (independent shards, in parallel up to ``jobs``;
``collect.run.collect`` resumes a run folder) → per task, the paired timing pass when the
config asks for one (``batch.timing``) and a divergence explorer page per relaxed rule
(``report.explorer``) → execute each task's notebooks with papermill
(``batch.notebooks``; a failing notebook is saved with its error and the batch goes on) →
export HTML with code hidden, write ``summary.json`` (and its table, ``summary.csv``) per
task and ``index.html`` over all tasks (``report.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec_audit.batch.calibration import calibrate_batch
from relaxspec_audit.batch.notebooks import (
    KERNEL_NAME,
    NotebookResult,
    check_kernel,
    execute_notebook,
    notebook_parameters,
)
from relaxspec_audit.batch.plan import BatchConfig, TaskPlan
from relaxspec_audit.batch.timing import time_task
from relaxspec_audit.batch.validation import ENGINES, load_config
from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig


@dataclass
class TaskResult:
    """Outcome of one task: its run folders, notebooks, summary and any collection error."""

    task: str
    run_dirs: list[Path]
    notebooks: list[NotebookResult]
    summary_path: Path | None
    errors: list[str]

    @property
    def ok(self) -> bool:
        """Whether everything for this task succeeded."""
        return not self.errors and all(nb.ok for nb in self.notebooks)


@dataclass
class BatchResult:
    """Outcome of :func:`run_batch`; ``ok`` is False when any run or notebook failed."""

    name: str
    report_dir: Path
    index: Path
    tasks: list[TaskResult]

    @property
    def ok(self) -> bool:
        """Whether every task succeeded."""
        return all(t.ok for t in self.tasks)


def _collect_one(
    config_json: str,
    runs_dir: str,
    threads: int,
    cost_table: Mapping[str, Any] | None = None,
    owner: str | None = None,
) -> tuple[str, str | None]:
    """Collect one run (in a worker process); return (run folder, error or None)."""
    config = RunConfig.from_json(config_json)
    try:
        import torch

        torch.set_num_threads(threads)  # share the cores between parallel shards
        from transformers.utils import logging as hf_logging

        from relaxspec_audit.batch.pairs import cached_pair
        from relaxspec_audit.collect.run import collect

        hf_logging.disable_progress_bar()  # the batch has its own bar over all runs

        draft = None if config.rule == TARGET_ONLY else config.draft
        pair = cached_pair(config.target, draft, config.device, config.dtype)
        path = collect(config, Path(runs_dir), resume=True, progress=None, pair=pair,
                       cost_table=cost_table, owner=owner)  # fmt: skip
        return str(path), None
    except Exception as exc:
        return str(config.run_dir(runs_dir)), f"{type(exc).__name__}: {exc}"


def collect_runs(
    configs: Sequence[RunConfig],
    runs_dir: str | Path,
    *,
    jobs: int = 1,
    on_done: Callable[[RunConfig, Path, str | None], None] | None = None,
    cost_tables: Mapping[str, Mapping[str, Any]] | None = None,
    owners: Mapping[str, str] | None = None,
) -> dict[str, tuple[Path, str | None]]:
    """Collect every run that is missing or unfinished, up to ``jobs`` in parallel.

    Runs are independent shards (docs/SCALING.md), so they go to a
    ``ProcessPoolExecutor`` (spawned workers: torch does not survive ``fork`` well);
    ``jobs=1`` collects in this process. Finished runs are cheap: ``collect.run.collect``
    resumes a run folder and skips finished requests.

    Args:
        configs: validated run configs.
        runs_dir: root of the run folders.
        jobs: parallel worker processes.
        on_done: called after each run with (config, run folder, error or None).
        cost_tables: ``{config.to_json(): cost table dict}`` recorded in each run's
            manifest (:func:`~relaxspec_audit.batch.calibration.calibrate_batch`).
        owners: ``{config.to_json(): owner-lease token}`` when the caller owns the runs
            (:func:`run_batch`); else each run's collect owns its own.

    Returns:
        ``{config.to_json(): (run folder, error or None)}``.
    """
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    runs_dir = Path(runs_dir)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    out: dict[str, tuple[Path, str | None]] = {}

    def done(config: RunConfig, path: str, error: str | None) -> None:
        out[config.to_json()] = (Path(path), error)
        if on_done is not None:
            on_done(config, Path(path), error)

    tables, owners = dict(cost_tables or {}), dict(owners or {})
    unowned = [c.run_dir(runs_dir) for c in configs if owners and c.to_json() not in owners]
    if unowned:  # its collect would take the run itself, and refuse: the caller holds it
        raise ValueError(f"owners: no owner token for run {unowned[0]}")
    if jobs == 1 or len(configs) <= 1:
        for config in configs:
            key = config.to_json()
            done(config, *_collect_one(key, str(runs_dir), threads, tables.get(key),
                                       owners.get(key)))  # fmt: skip
        return out
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {
            pool.submit(_collect_one, c.to_json(), str(runs_dir), threads,
                        tables.get(c.to_json()), owners.get(c.to_json())): c
            for c in configs
        }  # fmt: skip
        for fut in cf.as_completed(futures):
            config = futures[fut]
            try:
                path, error = fut.result()
            except Exception as exc:
                path, error = str(config.run_dir(runs_dir)), f"{type(exc).__name__}: {exc}"
            done(config, path, error)
    return out


def run_batch(
    config: str | Path | Mapping[str, Any] | BatchConfig,
    *,
    out: str | Path = "reports",
    runs: str | Path = "runs",
    jobs: int = 1,
    progress: bool = True,
    kernel_name: str = KERNEL_NAME,
    engine: str | None = None,
    ray_options: Mapping[str, Any] | None = None,
) -> BatchResult:
    """Run a batch audit end to end (see the module docstring for the recipe).

    Args:
        config: a YAML path, a parsed mapping, or a :class:`BatchConfig`.
        out: reports root; this batch writes ``<out>/<batch>/``.
        runs: run folders root (shared between batches: finished runs are reused).
        jobs: parallel collection processes (local engine).
        progress: show a ``tqdm.auto`` bar over the whole batch.
        kernel_name: Jupyter kernel for the notebooks.
        engine: ``"local"`` or ``"ray"``; None: the config's ``engine`` (default local).
        ray_options: keyword arguments of :class:`~relaxspec_audit.batch.ray_engine.
            RayEngine` (``address``, ``workers``, ``threads``, ``shard_size``, ...).

    Returns:
        The :class:`BatchResult`; ``ok`` is False if any run or notebook failed (the
        batch still finishes every other task).

    Raises:
        BatchConfigError: the config is invalid (nothing has been run).
        RuntimeError: the Jupyter kernel does not run this interpreter (nothing run).
    """
    from tqdm.auto import tqdm

    from relaxspec_audit import audit, report
    from relaxspec_audit.audit.results import TaskAudit
    from relaxspec_audit.collect.lease import hold_runs

    plan = config if isinstance(config, BatchConfig) else load_config(config)
    engine = engine or plan.engine
    if engine not in ENGINES:
        raise ValueError(f"engine: must be one of {list(ENGINES)}, got {engine!r}")
    runs_dir = runs_root(runs)
    if not isinstance(runs_dir, Path) and engine != "ray":
        raise ValueError(
            f"runs {runs_dir}: runs on an object store are collected by the Ray engine "
            "(--engine ray), which stages and pushes each commit"
        )
    check_kernel(kernel_name)  # before any work: a wrong kernel would fail every notebook
    report_dir = Path(out).resolve() / plan.name
    report_dir.mkdir(parents=True, exist_ok=True)
    all_runs = plan.all_runs()
    timed = [t for t in plan.tasks if t.timing]
    total = 1 + len(all_runs) + len(timed) + len(plan.tasks) * len(plan.notebooks)
    bar = tqdm(total=total, desc=f"batch {plan.name}", unit="step", disable=not progress)

    def on_done(config: RunConfig, path: Path, error: str | None) -> None:
        bar.set_postfix_str(f"{config.task}/{config.rule}", refresh=False)
        bar.update(1)

    cluster = None
    if engine == "ray":
        from relaxspec_audit.batch.ray_engine import RayEngine

        cluster = RayEngine(**dict(ray_options or {}))

        def on_shard(t: Mapping[str, Any]) -> None:  # progress over the whole cluster
            bar.set_postfix_str(
                f"shards {t['shards_done']}/{t['shards']}, {t['tokens']:,} tokens, "
                f"{t['workers']} workers, {t['retries']} retried",
                refresh=True,
            )

    # The batch owns its runs until they are collected (local roots; a store has no lock):
    # a second batch or collect on any of them is refused before anything loads, and this
    # one's writers stop if it loses one.
    local = {c.to_json(): c.run_dir(runs_dir) for c in all_runs if isinstance(runs_dir, Path)}
    held = contextlib.ExitStack()
    try:
        tokens = held.enter_context(hold_runs(local.values()))
    except BaseException:
        bar.close()
        raise
    owners = {key: tokens[path] for key, path in local.items()}
    try:
        bar.set_postfix_str("calibrating costs", refresh=False)
        try:
            calibrate = calibrate_batch if cluster is None else cluster.calibrate
            tables = calibrate(all_runs, runs_dir)
        except Exception as exc:
            # The runs still collect and are judged against their references by pass counts;
            # only the speed-up over target-only decoding needs the table (it shows as unknown).
            warnings.warn(f"cost calibration failed, no cost tables: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)  # fmt: skip
            tables = {}
        bar.update(1)
        if jobs > 1:  # each worker loads the pair itself: do not hold a third copy meanwhile
            from relaxspec_audit.batch.pairs import release

            release()
        if cluster is None:
            collected = collect_runs(all_runs, runs_dir, jobs=jobs, on_done=on_done,
                                     cost_tables=tables, owners=owners)  # fmt: skip
        else:
            collected = cluster.collect(all_runs, runs_dir, cost_tables=tables, on_done=on_done,
                                        progress=on_shard, owners=owners)  # fmt: skip
        # Every writer has ended: the runs are only read from here on (timing writes
        # runs/timing, notebooks read), so a notebook's own collect or a second batch
        # reusing them finished is not refused.
        held.close()
        results: list[TaskResult] = []
        for task in plan.tasks:
            task_dir = report_dir / task.slug
            task_dir.mkdir(parents=True, exist_ok=True)
            run_dirs = [collected[r.to_json()][0] for r in task.runs]
            errors = [
                f"collect {r.rule} {r.params or ''} split={r.split}: {collected[r.to_json()][1]}"
                for r in task.all_runs()
                if collected[r.to_json()][1] is not None
            ]
            if task.timing:
                bar.set_postfix_str(f"{task.slug}/timing", refresh=False)
                try:
                    if not errors:  # a family with a failed run has nothing whole to time
                        (time_task if cluster is None else cluster.time_task)(task, runs_dir)
                except Exception as exc:  # the report says so; the wall clock falls back
                    errors.append(f"timing pass: {type(exc).__name__}: {exc}")
                bar.update(1)
            collected_ok = not any(collected[r.to_json()][1] for r in task.all_runs())
            pages = _divergence_pages(task, runs_dir, task_dir, errors) if collected_ok else {}
            nav = [(f"divergences: {rule}", page) for rule, page in pages.items()]
            notebooks: list[NotebookResult] = []
            for name in plan.notebooks:
                bar.set_postfix_str(f"{task.slug}/{name}", refresh=False)
                declared = notebook_parameters(name)
                params = {k: v for k, v in task.parameters.items() if k in declared}
                params |= _batch_parameters(declared, runs_dir, task, task_dir, name)
                result = execute_notebook(
                    name, task_dir, params, kernel_name=kernel_name, cwd=task_dir, links=nav
                )
                notebooks.append(result)
                bar.update(1)
            summary_path = task_dir / "summary.json"
            entries = [_nb_entry(nb, task_dir) for nb in notebooks]
            signoff = task_dir / "signoff.numbers.json"
            if any(nb.name == "signoff" and nb.ok for nb in notebooks) and signoff.is_file():
                # The sign-off notebook audited this very task: reuse it, not recompute it.
                numbers = json.loads(signoff.read_text())
                numbers.pop("python", None)  # save_numbers' note of the kernel's interpreter
                decided = TaskAudit.model_validate(numbers)
            else:
                decided = audit.audit_task(
                    runs_dir, task.task,
                    parameters={"min_gain": task.min_gain, **task.parameters},
                )  # fmt: skip
            summary = audit.finish(decided, batch=plan.name, errors=errors, notebooks=entries,
                                   n_runs=len(run_dirs), pages=pages)  # fmt: skip
            summary.write(summary_path)
            # The same verdicts as a table, one row per family, for a spreadsheet or a review.
            report.write_summary_csv(summary, summary_path.with_suffix(".csv"))
            results.append(TaskResult(task.task, run_dirs, notebooks, summary_path, errors))
    finally:  # the actors (and their GPUs) end with the batch, whatever happened, and
        # only then are its runs released: no shard writes a run another batch may own
        try:
            if cluster is not None:
                cluster.close()
        finally:
            held.close()
    bar.close()
    index = report.write_index(report_dir, [TaskAudit.read(r.summary_path) for r in results])
    return BatchResult(name=plan.name, report_dir=report_dir, index=index, tasks=results)


def runs_root(runs: str | Path) -> Path | str:
    """The runs root: an absolute local path (``file://`` URIs too) or an ``s3://`` URL.

    Raises:
        ValueError: an unsupported location (``collect.storage.parse_store`` names it).
        ImportError: an ``s3://`` root without s3fs (naming the extra).
    """
    from relaxspec_audit.collect.storage import parse_store

    store = parse_store(runs)
    return store.root if store.is_local else store.url


def _divergence_pages(
    task: TaskPlan, runs_dir: Path, task_dir: Path, errors: list[str]
) -> dict[str, str]:
    """One divergence explorer page per relaxed rule of the task: ``{rule: file name}``.

    Built from the logs before the notebooks run, so that every report page links them.
    The confirmation split when the task has one (where the verdict is judged), else its
    first split. A rule with nothing to show is left out with a warning; a page that fails
    otherwise is recorded in ``errors`` (the sign-off still shows its divergence numbers).
    """
    from relaxspec_audit.audit.divergences import divergences
    from relaxspec_audit.audit.runs import TaskRuns
    from relaxspec_audit.report import explorer
    from relaxspec_audit.verify.registry import RULES

    splits = [r.split for r in task.runs]
    split = "confirmation" if "confirmation" in splits else (splits[0] if splits else None)
    rules = dict.fromkeys(
        r.rule for r in task.runs if r.rule in RULES and not RULES[r.rule].lossless
    )
    pages = {}
    runs = None
    for rule in rules:
        name = f"divergence-{rule}.html"
        try:
            nav = [("index", "../index.html"), ("sign-off", "signoff.html")]
            runs = runs or TaskRuns.load(runs_dir, task.task)
            view = divergences(runs, rule, split=split)
            explorer.divergence_page(view, task_dir / name, links=nav)
        except ValueError as exc:  # e.g. no run of the rule on that split: nothing to show
            warnings.warn(f"{task.slug}: no divergence page for {rule}: {exc}", stacklevel=2)
            continue
        except Exception as exc:  # a defect or a bad log: recorded, the batch goes on
            errors.append(f"divergence page {rule}: {type(exc).__name__}: {exc}")
            continue
        pages[rule] = name
    return pages


def _batch_parameters(
    declared: Mapping[str, Any], runs_dir: Path, task: TaskPlan, task_dir: Path, name: str
) -> dict[str, Any]:
    values = {
        "runs_dir": str(runs_dir),
        "task": task.task,
        "numbers_path": str(task_dir / f"{name}.numbers.json"),
    }
    if "min_gain" not in task.parameters:  # the task's `min_gain:` key
        values["min_gain"] = task.min_gain
    return {k: v for k, v in values.items() if k in declared}


def _nb_entry(nb: NotebookResult, task_dir: Path) -> dict[str, Any]:
    return {
        "name": nb.name,
        "ok": nb.ok,
        "html": nb.html.relative_to(task_dir).as_posix() if nb.html else None,
        "error": nb.error,
        "seconds": round(nb.seconds, 2),
    }
