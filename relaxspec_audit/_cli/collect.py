"""``relaxspec-audit collect``: decode a task under a rule and write per-position logs."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import click

from relaxspec_audit.collect.config import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    DTYPES,
    TARGET_ONLY,
    ConfigError,
    RunConfig,
)
from relaxspec_audit.verify import registry

_D = RunConfig()  # the defaults of every run option

#: Errors of writing the run folder (full, over quota, read-only, not permitted).
_WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
)


def rule_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one option per rule parameter in the registry (``--theta``, ``--budget``, …).

    Built from :data:`relaxspec_audit.verify.registry.RULES` when the command is built, so
    a rule added to the registry gets its options with nothing else to edit.
    """
    for opt in reversed(list(registry.cli_options().values())):
        kind = click.Choice(list(opt.choices)) if opt.choices else opt.type
        command = click.option("--" + opt.flag.replace("_", "-"), opt.flag, type=kind,
                               help=opt.help)(command)  # fmt: skip
    return command


def build_command() -> click.Command:
    """The ``collect`` command, with rule options from the registry as it is now.

    Defaults come from :class:`RunConfig` (one source of defaults).
    """

    @click.command("collect")
    @click.option("--task", default=_D.task, show_default=True, help="Task name or JSONL path.")
    @click.option(
        "--target", default=DEFAULT_TARGET, help="Target model path or id (default: embedded pair)."
    )
    @click.option(
        "--draft", default=DEFAULT_DRAFT, help="Draft model path or id (default: embedded pair)."
    )
    @click.option(
        "--rule",
        default=_D.rule,
        show_default=True,
        help=f"Verification rule, or '{TARGET_ONLY}' for target-only decoding.",
    )
    @rule_options
    @click.option(
        "--k", "k", default=_D.k, show_default=True, type=int, help="Draft tokens per round."
    )
    @click.option(
        "--temperature",
        type=float,
        help="Sampling temperature; 0 = greedy. [default: 0 for greedy-only rules, else 1]",
    )
    @click.option("--top-k", type=int, help="Sampling top-k applied to p and q.")
    @click.option("--top-p", type=float, help="Sampling top-p applied to p and q.")
    @click.option(
        "--seed",
        default=_D.seed,
        show_default=True,
        type=int,
        help="Seed of the coupled random stream.",
    )
    @click.option("--limit", type=int, help="Decode at most N items.")
    @click.option(
        "--split", type=click.Choice(["discovery", "confirmation"]), help="Only this split."
    )
    @click.option("--max-new-tokens", default=_D.max_new_tokens, show_default=True, type=int)
    @click.option(
        "--device",
        default=_D.device,
        show_default=True,
        callback=_check_device,
        help="auto, cpu, cuda, cuda:N, mps.",
    )
    @click.option(
        "--dtype",
        default=_D.dtype,
        show_default=True,
        type=click.Choice(list(DTYPES)),
    )
    @click.option(
        "--log-positions/--no-log-positions",
        default=_D.log_positions,
        show_default=True,
        help="Write the per-position table.",
    )
    @click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        help="Requests per target pass (batched static-cache engine, Llama-family pairs). "
        "[default: auto, 16 on CPU, 64 on CUDA; not part of the run id]",
    )
    @click.option(
        "--cuda-graphs",
        is_flag=True,
        default=_D.cuda_graphs,
        help="Replay the batched engine's fixed-shape calls from CUDA graphs (CUDA only; "
        "not part of the run id).",
    )
    @click.option(
        "--samples-per-item",
        default=_D.samples_per_item,
        show_default=True,
        type=click.IntRange(min=1),
        help="Completions per item, each with its own random keys (temperature > 0 only).",
    )
    @click.option(
        "--variant",
        hidden=True,
        help="Label of a replica run (e.g. coupling, floor-b1); part of the run id.",
    )
    @click.option(
        "--resume/--no-resume",
        default=True,
        show_default=True,
        help="Skip requests already in the run folder.",
    )
    @click.option(
        "--chunk-size",
        default=16,
        show_default=True,
        type=click.IntRange(min=1),
        help="Requests per committed Parquet part.",
    )
    @click.option(
        "--out",
        default="runs",
        show_default=True,
        type=click.Path(file_okay=False),
        help="Parent folder of run folders.",
    )
    @click.option(
        "--allow-draft-without-tokenizer",
        is_flag=True,
        help="Accept a draft folder without tokenizer files (its vocabulary is then checked "
        "by size only, not id by id against the target's tokenizer).",
    )
    @click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
    @click.option(
        "--cost-table/--no-cost-table",
        default=True,
        show_default=True,
        help="Record a cost table (a short calibration, reused from <out>/costs/ when one "
        "exists for this pair, device, dtype, K and batch size): the modelled speed-up "
        "needs it.",
    )
    @click.option(
        "--threads",
        type=int,
        help="torch CPU threads (small models on shared cores often run faster with 1).",
    )
    def collect(**opts: Any) -> None:
        """Decode a task under a verification rule and write per-position logs (Parquet)."""
        _collect(opts)

    return collect


def _check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--device``: auto, cpu, cuda, cuda:N or mps, checked before anything is loaded."""
    from relaxspec_audit.collect.pair import DecodeError, check_device  # light: no torch

    try:
        return check_device(value)
    except DecodeError as exc:
        raise click.BadParameter(str(exc).removeprefix("device: ")) from exc


collect = build_command()


def _collect(opts: dict[str, Any]) -> None:
    rule_opts = {name: opts.pop(name) for name in registry.cli_options()}
    rule = opts["rule"]
    temperature = opts["temperature"]
    if temperature is None:
        temperature = registry.default_temperature(rule)
    try:
        params = registry.params_from_options(rule, rule_opts)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        config = RunConfig(
            task=opts["task"],
            split=opts["split"],
            limit=opts["limit"],
            target=opts["target"],
            draft=opts["draft"],
            rule=rule,
            params=params,
            k=opts["k"],
            temperature=temperature,
            top_k=opts["top_k"],
            top_p=opts["top_p"],
            max_new_tokens=opts["max_new_tokens"],
            seed=opts["seed"],
            device=opts["device"],
            dtype=opts["dtype"],
            log_positions=opts["log_positions"],
            batch_size=opts["batch_size"],
            cuda_graphs=opts["cuda_graphs"],
            samples_per_item=opts["samples_per_item"],
            variant=opts["variant"],
        ).validate()
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint=f"'{exc.field}'") from exc

    from relaxspec_audit.collect.logs import LogError, read_manifest
    from relaxspec_audit.collect.pair import DecodeError
    from relaxspec_audit.collect.run import collect as collect_run  # heavy: torch

    if opts["threads"] is not None:
        if opts["threads"] < 1:
            raise click.BadParameter("must be >= 1", param_hint="'--threads'")
        import torch

        torch.set_num_threads(opts["threads"])

    bar = _Progress(enabled=opts["progress"])
    run_folder = config.run_dir(opts["out"])
    try:
        run_dir = collect_run(
            config,
            opts["out"],
            resume=opts["resume"],
            progress=bar.update,
            chunk_size=opts["chunk_size"],
            allow_untokenized_draft=opts["allow_draft_without_tokenizer"],
            calibrate=opts["cost_table"],
        )
    except (DecodeError, LogError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
        # A full or read-only disk, a folder without permission: name the run folder; the
        # parts committed before stay (the writer renames a part only when it is complete).
        why = os.strerror(exc.errno)
        raise click.ClickException(
            f"cannot write the run folder {run_folder}: {why} ({exc}); parts committed "
            "before this error are kept and a re-run resumes from them"
        ) from exc
    finally:
        bar.close()
    table = read_manifest(run_dir).cost_table
    for warning in table.warnings if table is not None else ():
        click.echo(f"warning: {warning}: modelled speed-ups priced from it say so", err=True)
    click.echo(run_dir)
    click.echo(summary_line(run_dir))


class _Progress:
    """tqdm bar of requests done, with tokens/s and mean τ in the postfix."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar: Any = None

    def update(self, totals: dict[str, Any]) -> None:
        if "engine" in totals:  # once, before decoding: which engine, and its KV cache
            click.echo(engine_line(totals["engine"]), err=True)
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=totals["total"], initial=totals["done"], unit="req")
        self.bar.n = totals["done"]
        passes = max(totals["passes"], 1)
        wall = max(totals["wall_s"], 1e-9)
        self.bar.set_postfix(
            tok_s=f"{totals['tokens'] / wall:.1f}", tau=f"{totals['tokens'] / passes:.2f}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def engine_line(engine: dict[str, Any]) -> str:
    """One line on the engine a run decodes with (the manifest's ``engine``)."""
    if engine.get("engine") == "static":
        return (
            f"engine: batched static cache, batch {engine['batch_size']}, "
            f"KV cache {engine['kv_cache_bytes'] / 2**20:.1f} MiB "
            f"(max_seq_len {engine['max_seq_len']})"
        )
    return (
        f"engine: batched over transformers' own caches, batch {engine.get('batch_size')} "
        f"({engine.get('reason')})"
    )


def summary_line(run_dir: Any) -> str:
    """One line over the whole run: requests, tokens, mean τ, acceptance_rate, tokens/s.

    ``acceptance_rate`` is the audit's α = Σ accepted / Σ reached (docs/STATISTICS.md §7,
    ``stats.speed``), computed by the same function, so ``collect`` and ``audit`` print
    one number under one name for a run.
    """
    import polars as pl

    from relaxspec_audit.audit.speedup import speed
    from relaxspec_audit.collect import logs

    req = (
        logs.scan(run_dir, "requests")
        .select(
            pl.len().alias("n"),
            pl.col("n_tokens").sum().alias("tokens"),
            pl.col("target_passes").sum().alias("passes"),
            pl.col("wall_s").sum().alias("wall"),
        )
        .collect()
        .row(0, named=True)
    )
    rounds = logs.scan(run_dir, "rounds")
    alpha = None
    if rounds.select(pl.len()).collect().item():
        alpha = speed(rounds)["alpha"][0]
    tokens = req["tokens"] or 0
    tau = tokens / req["passes"] if req["passes"] else float("nan")
    acc = alpha if alpha is not None else float("nan")
    tps = tokens / req["wall"] if req["wall"] else float("nan")
    return (
        f"requests {req['n']}  tokens {tokens}  mean tau {tau:.2f}  "
        f"acceptance_rate {acc:.3f}  tokens/s {tps:.1f}"
    )
