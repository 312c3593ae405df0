"""``relaxspec-audit tasks``: list the available task sets."""

from __future__ import annotations

import json

import click


@click.command("tasks")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def tasks(as_json: bool) -> None:
    """List the available task sets (bundled suites, GSM8K, HumanEval if installed, MT-Bench).

    A JSONL file of your own (``id``/``prompt``/``reference`` or GSM8K
    ``question``/``answer``) is a task too: pass its path wherever a task name goes.
    """
    from relaxspec_audit.tasks import list_tasks

    rows = list_tasks()
    if as_json:
        payload = [{k: row[k] for k in ("name", "splits", "scorer")} for row in rows]
        click.echo(json.dumps(payload, indent=2))
        return
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        splits = ", ".join(f"{split} {n}" for split, n in row["splits"].items())
        click.echo(
            f"{row['name']:<{width}}  {row['scorer']:<7}  {splits:<30}  {row['description']}"
        )
