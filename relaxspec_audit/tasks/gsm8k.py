"""GSM8K (Cobbe et al. 2021): the 1,319 test problems, vendored, bare or as a chat turn.

The test split ships with the package (``tasks/data/gsm8k/``: ``test.jsonl`` with its MIT
``LICENSE`` and ``SOURCE.md``) and is checked against its pinned sha256 on every load.

- ``gsm8k``: the bare prompt ``Q: {question}`` / ``A:`` (two lines, the format of the
  bundled ``arith`` and of GSM8K-format JSONL files), stopping at a next ``Q:``;
- ``gsm8k-<template>`` (``gsm8k-qwen-chat``): the question as one chat turn
  (``tasks.chat``), zero-shot, asking for the reasoning step by step and a last line
  ``#### <number>`` (:data:`GSM8K_USER`); the instruct model ends its turn itself.

Each item's reference is the number on the solution's ``####`` line (commas dropped), its
``metadata`` the worked ``solution`` and the ``question``; completions are scored by
``score_numeric`` (the final number: after the last ``####``, else the last number).
Ids are ``gsm8k-<line>``, as ``load_jsonl`` names a GSM8K file's items, and splits are by
hash of the id, so both variants have the same items in the same splits.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from relaxspec_audit.tasks.chat import CHAT_TEMPLATES, chat_prompt
from relaxspec_audit.tasks.jsonl import _field
from relaxspec_audit.tasks.scorers import score_numeric
from relaxspec_audit.tasks.task import Task, TaskError, TaskItem, hash_split

GSM8K = "gsm8k"
#: The vendored test split (package data) and what it must be.
GSM8K_FILE = Path(__file__).resolve().parent / "data" / "gsm8k" / "test.jsonl"
GSM8K_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
GSM8K_ITEMS = 1319
#: The user turn of ``gsm8k-<template>``: zero-shot, step by step, a fixed answer line.
GSM8K_USER = (
    "Solve the following math problem step by step. At the end, write the final answer "
    'alone on the last line, in the form "#### <number>".\n\n{question}'
)
#: Where a bare completion ends: a model that runs on writes the next question.
GSM8K_STOP = ("\nQ:",)


def _final_number(path: Path, lineno: int, answer: str) -> str:
    """The reference: the number on the solution's ``####`` line, strictly (no search)."""
    _, sep, tail = answer.rpartition("####")
    text = tail.strip().replace(",", "")
    try:
        float(text)
    except ValueError:
        text = ""
    if not sep or not text:
        raise TaskError(f"{path}:{lineno}: field 'answer' does not end in '#### <number>'")
    return text


def load_gsm8k(prompt_template: str | None = None) -> Task:
    """Load the vendored GSM8K test split, bare or rendered as a chat turn.

    Args:
        prompt_template: ``None`` for the bare prompt (task ``gsm8k``) or one of
            :data:`relaxspec_audit.tasks.chat.CHAT_TEMPLATES` (task ``gsm8k-<template>``).

    Returns:
        The task: 1,319 items, scorer ``numeric``.

    Raises:
        TaskError: Unknown template; the file is missing, differs from the pinned sha256
            or has a malformed line (naming the file and line).
    """
    if prompt_template is not None and prompt_template not in CHAT_TEMPLATES:
        raise TaskError(
            f"prompt_template: must be one of {list(CHAT_TEMPLATES)}, got {prompt_template!r}"
        )
    path = GSM8K_FILE
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TaskError(f"{path}: cannot read the vendored GSM8K data: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != GSM8K_SHA256:
        raise TaskError(
            f"{path}: sha256 {digest} does not match the pinned {GSM8K_SHA256} "
            "(tasks/data/gsm8k/SOURCE.md); the vendored file was changed"
        )
    # Parsed from the bytes just hashed, so what loads is what was checked.
    items = []
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:  # pragma: no cover - implied by the pinned hash
            raise TaskError(f"{path}:{lineno}: malformed JSON: {exc.msg}") from exc
        question = _field(path, lineno, obj, "question", (str,))
        answer = _field(path, lineno, obj, "answer", (str,))
        item_id = f"{GSM8K}-{lineno}"
        if prompt_template is None:
            prompt = f"Q: {question}\nA:"
        else:
            prompt = chat_prompt(GSM8K_USER.format(question=question), prompt_template)
        items.append(
            TaskItem(
                id=item_id,
                prompt=prompt,
                reference=_final_number(path, lineno, answer),
                split=hash_split(item_id),
                metadata={"solution": answer, "question": question},
            )
        )
    if len(items) != GSM8K_ITEMS:  # pragma: no cover - implied by the pinned hash
        raise TaskError(f"{path}: {len(items)} problems, expected {GSM8K_ITEMS}")
    if prompt_template is None:
        return Task(
            GSM8K,
            items,
            score_numeric,
            "numeric",
            "GSM8K test split (vendored, MIT); Q:/A: prompt; final-number match.",
            stop=GSM8K_STOP,
        )
    return Task(
        f"{GSM8K}-{prompt_template}",
        items,
        score_numeric,
        "numeric",
        f"GSM8K test split as a {prompt_template} turn, step by step to '#### <number>'; "
        "final-number match.",
    )
