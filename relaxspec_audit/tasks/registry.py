"""The task registry: load a task by name or JSONL path, list the tasks available here.

Names: the bundled suites (``arith``, ``sort``, ``story``), ``gsm8k`` (vendored) and
``humaneval``, each with its chat variants (``<task>-<template>``), ``mtbench``; anything
else is read as a JSONL file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relaxspec_audit.tasks.bundled import BUNDLED, _bundled
from relaxspec_audit.tasks.chat import CHAT_TEMPLATES
from relaxspec_audit.tasks.gsm8k import GSM8K, load_gsm8k
from relaxspec_audit.tasks.humaneval import _humaneval_installed, load_humaneval
from relaxspec_audit.tasks.jsonl import load_jsonl
from relaxspec_audit.tasks.mtbench import _MTBENCH_DESCRIPTION, MTBENCH, load_mtbench
from relaxspec_audit.tasks.task import SPLITS, Task, TaskError


def _registered(key: str) -> Task | None:
    """The task registered under ``key``, or ``None`` when ``key`` is not a task name."""
    if key in BUNDLED:
        return _bundled(key)
    if key == GSM8K:
        return load_gsm8k()
    if key.startswith(f"{GSM8K}-") and key.removeprefix(f"{GSM8K}-") in CHAT_TEMPLATES:
        return load_gsm8k(prompt_template=key.removeprefix(f"{GSM8K}-"))
    if key == "humaneval":
        return load_humaneval()
    if key.startswith("humaneval-") and key.removeprefix("humaneval-") in CHAT_TEMPLATES:
        return load_humaneval(prompt_template=key.removeprefix("humaneval-"))
    if key == MTBENCH:
        return load_mtbench()
    return None


def task_names() -> list[str]:
    """Every registered task name (whether or not its data is available here)."""
    return [*_vendored(), "humaneval", *(f"humaneval-{t}" for t in CHAT_TEMPLATES), MTBENCH]


def _vendored() -> list[str]:
    """The tasks whose data ships with the package: the generated suites and GSM8K."""
    return [*BUNDLED, GSM8K, *(f"{GSM8K}-{t}" for t in CHAT_TEMPLATES)]


def load_task(name_or_path: str | Path, split: str | None = None, limit: int | None = None) -> Task:
    """Load a task by registered name or path to a JSONL file.

    Args:
        name_or_path: ``arith``, ``sort``, ``story``, ``gsm8k`` (bare prompt),
            ``gsm8k-qwen-chat`` (Qwen chat turn, step by step), ``humaneval`` (bare prompts),
            ``humaneval-qwen-chat`` (Qwen chat turn, code pre-filled), ``mtbench``
            (first turns, from the real-pair cache), or a ``.jsonl`` / ``.jsonl.gz`` file
            (generic or GSM8K format; ``~`` is expanded).
        split: Keep only this split (``discovery`` or ``confirmation``); ``None`` keeps all.
        limit: Keep at most this many items (after the split filter, in order).

    Returns:
        The task.

    Raises:
        TaskError: Unknown name, missing file, bad split or limit, a bad file, or
            ``mtbench`` before ``relaxspec-audit fetch-real``.
    """
    key = str(name_or_path)
    task = _registered(key)
    if task is None:
        path = Path(key).expanduser()
        if not path.exists():
            raise TaskError(f"unknown task '{key}': not one of {task_names()} and no such file")
        task = load_jsonl(path)
    if split is not None:
        if split not in SPLITS:
            raise TaskError(f"split: must be one of {list(SPLITS)}, got {split!r}")
        task.items = [item for item in task.items if item.split == split]
    if limit is not None:
        if limit < 0:
            raise TaskError(f"limit: must be >= 0, got {limit}")
        task.items = task.items[:limit]
    return task


def list_tasks() -> list[dict[str, Any]]:
    """The tasks available by name: bundled suites, GSM8K, HumanEval if installed, MT-Bench.

    ``mtbench`` is always listed (so a batch config naming it validates), with
    ``available: False``, no splits and a description saying to run
    ``relaxspec-audit fetch-real`` while its task file is not cached; loading it then
    raises :class:`TaskError` with the same advice.

    Returns:
        One ``{"name", "splits": {split: count}, "scorer", "description", "available"}``
        per task.
    """
    names = _vendored()
    if _humaneval_installed():
        names += ["humaneval", *(f"humaneval-{t}" for t in CHAT_TEMPLATES)]
    names.append(MTBENCH)
    out = []
    for name in names:
        try:
            task = load_task(name)
        except TaskError as exc:
            if name != MTBENCH:
                raise
            out.append(
                {
                    "name": name,
                    "splits": {},
                    "scorer": "none",
                    "description": f"{_MTBENCH_DESCRIPTION} Not available: {exc}",
                    "available": False,
                }
            )
            continue
        out.append(
            {
                "name": name,
                "splits": task.splits(),
                "scorer": task.scorer_name,
                "description": task.description,
                "available": True,
            }
        )
    return out
