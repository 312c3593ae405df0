"""The task model: a :class:`Task` is a named list of :class:`TaskItem` plus a scorer.

The scorer is ``score(item, completion_text) -> float | None`` (``tasks.scorers``).

Every item has a split, ``discovery`` or ``confirmation`` (THEORY §3, "Choosing θ or a
budget": a setting is chosen on one split and confirmed on the other). External sets
without a ``split`` field are split half/half by a stable hash of the item id
(:func:`hash_split`).

Prompts and completions follow one format so a decoder can encode ``prompt`` with
``tokenizer(prompt)`` (no special tokens are added) and stop at ``eos``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPLITS = ("discovery", "confirmation")


class TaskError(ValueError):
    """A task file or task name is invalid; the message names file, line and field."""


@dataclass(frozen=True)
class TaskItem:
    """One prompt of a task.

    Attributes:
        id: Unique id within the task (the logs' ``item_id``).
        prompt: Text given to the model, encoded with ``tokenizer(prompt)``.
        reference: Expected answer (a number as text, a digit list, ...) or ``None``
            for open-ended items.
        split: ``discovery`` or ``confirmation``.
        metadata: Anything else the scorer needs (e.g. HumanEval tests, entry point).
    """

    id: str
    prompt: str
    reference: str | None
    split: str
    metadata: dict[str, Any] = field(default_factory=dict)


Scorer = Callable[[TaskItem, str], "float | None"]


@dataclass
class Task:
    """A named set of items and the scorer that grades a completion of each.

    Attributes:
        name: Task name (the logs' ``task``).
        items: The items, in a stable order.
        scorer: ``score(item, completion_text) -> float | None``; ``None`` means the
            item has no reference (open-ended generation).
        scorer_name: Short name of the scorer (``numeric``, ``exact``, ``code``, ``none``).
        description: One line for ``relaxspec-audit tasks``.
        stop: Decode-time stop strings: a completion ends at the token whose text
            completes one (``collect.stops``); empty: EOS or the length limit only.
    """

    name: str
    items: list[TaskItem]
    scorer: Scorer
    scorer_name: str
    description: str = ""
    stop: tuple[str, ...] = ()

    def score(self, item: TaskItem, completion: str) -> float | None:
        """Score one completion of ``item`` with this task's scorer."""
        return self.scorer(item, completion)

    def splits(self) -> dict[str, int]:
        """Item count per split."""
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item.split] = counts.get(item.split, 0) + 1
        return counts


def hash_split(item_id: str) -> str:
    """Stable half/half split of an item id (sha256, independent of the process)."""
    digest = hashlib.sha256(item_id.encode("utf-8")).digest()
    return SPLITS[digest[0] & 1]
