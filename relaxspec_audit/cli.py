"""The ``relaxspec-audit`` command line.

Each sub-command lives in ``relaxspec_audit/_cli/<name>.py`` and is imported only when it
is invoked, so ``relaxspec-audit --help`` starts without torch, transformers or papermill.
The command modules parse options and print; the work is done by package functions that
notebooks call too.
"""

from __future__ import annotations

import importlib

import click

# command name -> (module under relaxspec_audit._cli, attribute, one-line help)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "tasks": ("tasks", "tasks", "List the available task sets."),
    "collect": ("collect", "collect", "Decode a task under a rule and write per-position logs."),
    "audit": ("audit", "audit", "Audit statistics over one or more run folders."),
    "batch": ("batch", "batch", "Collect what is missing and render per-task audit reports."),
    "demo": ("batch", "demo", "Run the bundled demo batch on the embedded model pair."),
    "fetch-real": ("real", "fetch_real", "Fetch, verify and cache the real Qwen2.5-Coder pair."),
    "time": ("time", "time", "Paired wall-clock timing pass of runs against a reference."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[cmd_name]
        try:
            mod = importlib.import_module(f"relaxspec_audit._cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"relaxspec_audit._cli.{module}":
                return None
            raise
        return getattr(mod, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text from the table above: listing commands must not import torch.
        rows = [(name, help_) for name, (_, _, help_) in _COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="relaxspec_audit")
def main() -> None:
    """Audit relaxed verification rules of speculative decoding (NSD, ASD, ...)."""


if __name__ == "__main__":  # pragma: no cover
    main()
