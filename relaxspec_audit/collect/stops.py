"""Decode-time stop sequences: a request ends once its generated text contains one.

A task may name stop strings (HumanEval's new line + ``def``, new line + ``class``, the
closing code fence, …). Without them every row decodes to ``max_new_tokens``; with them a
row ends at the token whose text completes a stop string (that token is kept, as
transformers' ``StopStringCriteria`` does), its ``stop`` is ``"stop"``, and in a batch its
slot is refilled at once. The scorer's truncation stays as a second line of defence.

Only generated text is searched (never the prompt), and it is checked token by token as it
is emitted, so a stop string is found at the token that completes it: the windows decoded
are short (the longest stop string plus a little), not the whole output each time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopStrings:
    """Finds the first token that completes one of ``stops`` in a growing output.

    Args:
        tokenizer: decodes token ids (special tokens skipped: an EOS adds no text).
        stops: the stop strings (non-empty).
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        if not self.stops:
            raise ValueError("stops: give at least one non-empty stop string")
        self.tokenizer = tokenizer
        # Every token adds at least one character, except a few special or byte pieces;
        # twice the longest stop string covers it with room to spare.
        self.window = 2 * max(len(s) for s in self.stops) + 2

    def cut(self, output: Sequence[int], n_new: int) -> int | None:
        """How many of the last ``n_new`` tokens of ``output`` to keep, or None.

        Returns the count ``c`` (1 ≤ c ≤ n_new) such that the ``c``-th new token is the
        first whose text completes a stop string; None when no new token does. Earlier
        tokens were checked when they were new, so only new tokens can complete one.
        """
        first = len(output) - n_new
        for j in range(first, len(output)):
            lo = max(0, j + 1 - self.window)
            text = self.tokenizer.decode(list(output[lo : j + 1]), skip_special_tokens=True)
            if any(s in text for s in self.stops):
                return j - first + 1
        return None
