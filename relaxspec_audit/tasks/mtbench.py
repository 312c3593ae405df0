"""MT-Bench first turns (task ``mtbench``), read from the real-pair cache.

``relaxspec-audit fetch-real`` writes the task file
(:func:`relaxspec_audit.tasks.mtbench_fetch.mtbench_task_path`): chat-rendered prompts, no
references.
"""

from __future__ import annotations

from relaxspec_audit.tasks.jsonl import load_jsonl
from relaxspec_audit.tasks.task import Task, TaskError

MTBENCH = "mtbench"
_MTBENCH_DESCRIPTION = "MT-Bench first turns in Qwen chat format; open-ended, no scorer."


def load_mtbench() -> Task:
    """Load MT-Bench first turns from the real-pair cache (task ``mtbench``).

    The file is :func:`relaxspec_audit.tasks.mtbench_fetch.mtbench_task_path`
    (``$RELAXSPEC_AUDIT_CACHE`` or ``~/.cache/relaxspec_audit``), written by
    ``relaxspec-audit fetch-real``: 80 chat-rendered prompts, no references (scorer
    ``none``), split by hash of the id.

    Returns:
        The task.

    Raises:
        TaskError: The task file is not cached (the message says how to fetch it) or is
            malformed.
    """
    from relaxspec_audit.tasks.mtbench_fetch import mtbench_task_path

    path = mtbench_task_path()
    if not path.is_file():
        raise TaskError(
            f"task 'mtbench': {path} not found; run `relaxspec-audit fetch-real` "
            "(or `relaxspec-audit fetch-real --only mtbench`) to fetch the MT-Bench questions"
        )
    task = load_jsonl(path, name=MTBENCH)
    task.description = _MTBENCH_DESCRIPTION
    return task
