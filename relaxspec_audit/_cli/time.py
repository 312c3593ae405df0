"""``relaxspec-audit time``: a paired wall-clock timing pass of runs against a reference.

Rebuilds each run's configuration from its manifest, loads the pair once, decodes a sample
of the task's items under every configuration alternated in a balanced order
(:func:`relaxspec_audit.collect.timing.timing_pass`), writes ``<runs>/timing/<id>.json`` and
prints each candidate's wall-clock speed-up over the reference with its interval
(:func:`relaxspec_audit.audit.walltime.timing_speedups`). Heavy imports happen inside the
command: ``relaxspec-audit --help`` does not import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def _configs(run_dirs: list[str]) -> tuple[list[Any], list[Any]]:
    """The runs' configs and manifests; refuse runs that cannot share one pass."""
    from relaxspec_audit.collect.config import TARGET_ONLY
    from relaxspec_audit.collect.logs import LogError, read_manifest

    configs, manifests = [], []
    for d in run_dirs:
        try:
            m = read_manifest(d)
        except LogError as exc:
            raise click.ClickException(f"{d}: cannot rebuild the run's config: {exc}") from exc
        configs.append(m.config)
        manifests.append(m)
    ref = configs[0]
    for d, c in zip(run_dirs[1:], configs[1:], strict=True):
        for field in ("task", "split", "target", "device", "dtype", "max_new_tokens"):
            if getattr(c, field) != getattr(ref, field):
                raise click.ClickException(
                    f"{d}: config field {field!r} is {getattr(c, field)!r} but the reference "
                    f"{run_dirs[0]} has {getattr(ref, field)!r}; one timing pass needs one "
                    "pair, device, dtype and task"
                )
    drafts = {c.draft for c in configs if c.rule != TARGET_ONLY}
    if len(drafts) > 1:
        raise click.ClickException(f"config field 'draft' differs between runs: {sorted(drafts)}")
    return configs, manifests


@click.command("time")
@click.argument("ref_run_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("cand_run_dirs", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))  # fmt: skip
@click.option("--items", "n_items", type=click.IntRange(min=1), default=16, show_default=True,
              help="Items of the task sampled for the pass.")  # fmt: skip
@click.option("--repeats", type=click.IntRange(min=2), default=6, show_default=True,
              help="Timed replicates of each run (a multiple of the number of runs).")  # fmt: skip
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Untimed decodes of each run first.")  # fmt: skip
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Rows per target pass (default: the reference run's).")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the item sample.")  # fmt: skip
@click.option("--runs", "runs_dir", type=click.Path(file_okay=False), default="runs",
              show_default=True, help="Runs folder (the result: <runs>/timing/).")  # fmt: skip
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.05, show_default=True, help="1 − confidence level.")  # fmt: skip
def time(
    ref_run_dir: str,
    cand_run_dirs: tuple[str, ...],
    n_items: int,
    repeats: int,
    warmup: int,
    batch_size: int | None,
    seed: int,
    runs_dir: str,
    alpha: float,
) -> None:
    """Paired wall-clock timing of CAND_RUN_DIRS against REF_RUN_DIR, alternated in one process.

    The interval is a t interval on per-replicate log ratios, so run-to-run noise is in
    it. This measure is labelled and never decides; the modelled speed-up does.
    """
    import random

    from relaxspec_audit import tasks
    from relaxspec_audit.audit.walltime import timing_label, timing_speedups, timing_warnings
    from relaxspec_audit.collect.config import TARGET_ONLY
    from relaxspec_audit.collect.pair import DecodeError, encode_prompt, load_pair
    from relaxspec_audit.collect.stops import StopStrings
    from relaxspec_audit.collect.timing import save_timing, timing_pass

    run_dirs = [ref_run_dir, *cand_run_dirs]
    configs, manifests = _configs(run_dirs)
    ref = configs[0]
    if batch_size is None:
        batch_size = manifests[0].engine.get("batch_size") or ref.batch_size
    spec = [c for c in configs if c.rule != TARGET_ONLY]
    try:
        pair = load_pair(ref.target, spec[0].draft if spec else None, ref.device, ref.dtype)
    except (DecodeError, OSError) as exc:
        raise click.ClickException(f"cannot load the pair: {exc}") from exc
    task = tasks.load_task(ref.task, split=ref.split, limit=ref.limit)
    items = sorted(task.items, key=lambda it: it.id)
    if n_items < len(items):
        items = sorted(random.Random(seed).sample(items, n_items), key=lambda it: it.id)
    requests = [(it.id, encode_prompt(pair, it.prompt)) for it in items]
    stops = StopStrings(pair.tokenizer, task.stop) if task.stop else None
    click.echo(f"timing {len(configs)} runs × {repeats} replicates on {len(requests)} items "
               f"of {task.name} on {pair.device}", err=True)  # fmt: skip
    try:
        result = timing_pass(pair, configs, requests, repeats=repeats, warmup=warmup,
                             batch_size=batch_size, stops=stops)  # fmt: skip
    except (DecodeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    result["run_dirs"] = [str(Path(d)) for d in run_dirs]
    path = save_timing(result, runs_dir)
    table = timing_speedups(result, alpha=alpha)
    for warning in timing_warnings(result):
        click.echo(f"warning: {warning}", err=True)
    click.echo(timing_label(result))
    click.echo(f"reference: {ref.rule} ({run_dirs[0]})")
    for row in table.iter_rows(named=True):
        det = "" if row["deterministic"] else "  (outputs varied between replicates)"
        ci = "[no interval]"
        if row["ci_low"] == row["ci_low"]:  # NaN below the replicates an interval needs
            ci = f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        click.echo(f"  {row['rule']:<10} {row['run_id']}  {row['speedup']:.3f}x {ci}{det}")
    click.echo(f"wrote {path}")
