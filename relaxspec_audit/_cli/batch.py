"""``relaxspec-audit batch`` and ``demo``: parse options, call ``batch.run_batch``, print."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click


def _run(
    config: str | Path,
    out: str,
    runs: str,
    jobs: int,
    progress: bool,
    engine: str | None = None,
    ray_options: dict | None = None,
) -> None:
    from relaxspec_audit import batch as batch_mod

    start = time.perf_counter()
    try:
        plan = batch_mod.load_config(config)
    except batch_mod.BatchConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        batch_mod.check_kernel()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    chosen = engine or plan.engine
    if (
        chosen != "ray"
        and ray_options
        and any(ray_options.get(k) is not None for k in ("address", "workers"))
    ):
        raise click.ClickException("--address and --workers need --engine ray (or engine: ray)")
    try:
        root = batch_mod.runs_root(runs)
    except (ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from exc
    if not isinstance(root, Path) and chosen != "ray":
        raise click.ClickException(f"--runs {root}: runs on an object store need --engine ray")
    runs = str(root)
    from relaxspec_audit.collect.lease import LeaseHeldError

    try:
        result = batch_mod.run_batch(plan, out=out, runs=runs, jobs=jobs, progress=progress,
                                     engine=engine, ray_options=ray_options)  # fmt: skip
    except LeaseHeldError as exc:  # another batch or collect owns one of the runs
        raise click.ClickException(str(exc)) from exc
    minutes = (time.perf_counter() - start) / 60
    for task in result.tasks:
        status = "ok" if task.ok else "FAILED"
        click.echo(f"  {task.task}: {status}")
        for error in task.errors:
            click.echo(f"    {error}", err=True)
        for nb in task.notebooks:
            if not nb.ok:
                click.echo(f"    notebook {nb.name}: {nb.error} (saved: {nb.ipynb})", err=True)
    click.echo(f"batch {result.name}: {len(result.tasks)} task(s) in {minutes:.1f} min")
    click.echo(f"index: {result.index}")
    if not result.ok:
        raise SystemExit(1)


_jobs = click.option(
    "--jobs",
    "-j",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Runs collected in parallel (independent shards, one process each).",
)
_out = click.option(
    "--out",
    default="reports",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Reports root; the batch writes <out>/<batch>/.",
)
_runs = click.option(
    "--runs",
    default="runs",
    show_default=True,
    help="Run folders root: a path, a file:// URI, or s3://bucket/prefix with --engine ray "
    "(endpoint and keys from AWS_* variables); finished runs are reused, unfinished ones "
    "resumed.",
)
_progress = click.option("--progress/--no-progress", default=True, help="Progress bar.")


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@_jobs
@_out
@_runs
@_progress
@click.option(
    "--engine", type=click.Choice(["local", "ray"]), default=None,
    help="Where runs are collected (default: the config's `engine`, else local). ray: "
    "shards on a Ray cluster, docs/SCALING.md.",
)  # fmt: skip
@click.option(
    "--address", default=None,
    help="Ray cluster to join (auto, ray://host:10001); default: start a local one.",
)  # fmt: skip
@click.option(
    "--workers", type=click.IntRange(min=1), default=None,
    help="Ray actors (default: one per GPU for cuda runs, else CPUs / 2).",
)  # fmt: skip
@click.option(
    "--shard-size", type=click.IntRange(min=1), default=32, show_default=True,
    help="Requests per Ray shard.",
)  # fmt: skip
def batch(
    config: str,
    jobs: int,
    out: str,
    runs: str,
    progress: bool,
    engine: str | None,
    address: str | None,
    workers: int | None,
    shard_size: int,
) -> None:
    """Collect what is missing and render per-task audit reports for CONFIG (YAML).

    The whole config is validated before any work. Exits non-zero if any run or notebook
    failed (the other tasks still finish); a failed notebook is saved with its error.
    """
    ray_options = {"address": address, "workers": workers, "shard_size": shard_size}
    _run(config, out, runs, jobs, progress, engine, ray_options)


@click.command()
@click.option(
    "--jobs", "-j", default=min(2, os.cpu_count() or 1), show_default=True,
    type=click.IntRange(min=1),
    help="Runs collected in parallel (the tiny embedded pair decodes faster as 2 processes "
    "on 2 cores than as one).",
)  # fmt: skip
@_out
@_runs
@_progress
def demo(jobs: int, out: str, runs: str, progress: bool) -> None:
    """Run the bundled demo batch (embedded model pair, bundled tasks) and print the index."""
    from relaxspec_audit import batch as batch_mod

    _run(batch_mod.bundled_config("demo"), out, runs, jobs, progress)
