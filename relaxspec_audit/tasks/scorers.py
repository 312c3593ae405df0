"""Scorers: grade one completion of one item (numeric, exact, code, none).

``numeric`` compares the final number of a GSM8K-style solution (``#### n``), ``exact``
the stripped text, ``code`` runs the completion cut at the HumanEval stop sequences
(Chen et al. 2021) against its tests in :mod:`relaxspec_audit.tasks.sandbox`, ``none`` is for
open-ended items without a reference.
"""

from __future__ import annotations

import re

from relaxspec_audit.tasks.task import Scorer, TaskItem

# A number: digits, or digits grouped in threes by commas (1,234,567; "1,2,3" is three
# numbers), optional decimals ("18." is 18: a sentence's full stop), and a minus sign only
# where it cannot be subtraction (not after a letter, digit or point: "5-3" is 5 and 3).
# Currency signs and units around it are not part of it ("$1,234.50 dollars" is 1234.5).
_SIGN = r"(?:(?<![\w.])-)?"
_NUMBER = re.compile(_SIGN + r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?" + "|" + _SIGN + r"\.\d+")


def _parse_number(text: str) -> float | None:
    text = text.replace(",", "").rstrip(".")
    try:
        return float(text)
    except ValueError:
        return None


def extract_answer(text: str) -> float | None:
    """Extract the final numeric answer of a GSM8K-style solution.

    The number right after the last ``####`` if there is one, else the last number in
    the text. Thousands commas are ignored (``1,234`` → 1234), signs and decimals are
    kept (``-3.5``), currency signs, units and a trailing full stop around the number are
    ignored (``$1,234.50 dollars.`` → 1234.5), and so is trailing text after the
    ``####`` number.

    Args:
        text: A model completion or a reference solution.

    Returns:
        The number, or ``None`` when the text holds no number.
    """
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        match = _NUMBER.search(tail)
        if match is not None:
            return _parse_number(match.group())
    numbers = _NUMBER.findall(text)
    for candidate in reversed(numbers):
        value = _parse_number(candidate)
        if value is not None:
            return value
    return None


def score_numeric(item: TaskItem, completion: str) -> float | None:
    """1.0 if the completion's final number equals the reference number, else 0.0."""
    if item.reference is None:
        return None
    want = extract_answer(item.reference)
    got = extract_answer(completion)
    if want is None or got is None:
        return 0.0
    return float(abs(got - want) <= 1e-9 * max(1.0, abs(want)))


def score_exact(item: TaskItem, completion: str) -> float | None:
    """1.0 if the completion equals the reference up to surrounding whitespace."""
    if item.reference is None:
        return None
    return float(completion.strip() == item.reference.strip())


def score_none(item: TaskItem, completion: str) -> float | None:
    """Open-ended items have no score."""
    return None


# Where a HumanEval completion ends. The model does not stop at the end of the function: a
# raw completion runs on into a second ``def``, a test harness or ``print`` calls, and a
# chat-prefilled one closes its code fence. Chen et al. 2021 (Codex, HumanEval) cut every
# sample at the stop sequences "\nclass", "\ndef", "\n#", "\nif", "\nprint"; we use the
# same set (``if`` narrowed to the ``__main__`` guard) plus the markdown fence.
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "```")


def truncate_code(completion: str, stop: tuple[str, ...] = HUMANEVAL_STOP) -> str:
    """Cut a code completion at the first stop sequence (standard HumanEval practice).

    Only text the model generated is searched, so a stop sequence inside the prompt
    (a ``#`` comment line, the opening fence of a chat prefill) never cuts anything.
    Stop sequences start with a newline (except the fence), so indented lines of the
    function body (``    # note``, ``    print(x)``) are kept.

    Args:
        completion: The decoded completion.
        stop: Stop sequences; default :data:`HUMANEVAL_STOP`.

    Returns:
        The completion up to (not including) the earliest stop sequence, or all of it.
    """
    cut = len(completion)
    for seq in stop:
        at = completion.find(seq)
        if at != -1:
            cut = min(cut, at)
    return completion[:cut]


def score_code(item: TaskItem, completion: str) -> float | None:
    """Run ``code_prefix + truncated completion`` against the pristine tests; 1.0 iff pass.

    The completion is cut at :data:`HUMANEVAL_STOP` first (:func:`truncate_code`). The
    program is ``metadata["code_prefix"]`` (the plain HumanEval prompt), falling back to
    ``item.prompt``, plus the completion, so a chat-prefilled model prompt still scores as
    ``problem["prompt"] + completion``. ``metadata`` must hold ``test`` (code defining
    ``check``) and ``entry_point`` (the function name passed to ``check``). The sandbox
    runs the program in one process and the tests in another that never runs it: the
    tests' process has the prefix's own helpers (HumanEval/32's ``poly``, not one the
    completion redefined), fresh standard modules, and calls the entry point across a
    pipe with plain data only. A pass is that process's report that ``check`` returned,
    never an exit status: a wrong body that exits early, patches a module, redefines a
    helper, reads the tests from disk or from a frame, or returns an object that fakes
    equality scores 0.0, as do a hang, crash, fork bomb or memory blow-up (see
    :mod:`relaxspec_audit.tasks.sandbox`, which also says what remains possible).
    """
    from relaxspec_audit.tasks import sandbox

    prefix = item.metadata.get("code_prefix", item.prompt)
    program = prefix + truncate_code(completion) + "\n"
    timeout = float(item.metadata.get("timeout_s", sandbox.DEFAULT_TIMEOUT_S))
    result = sandbox.run_program(
        program,
        timeout_s=timeout,
        tests=item.metadata["test"],
        entry_point=item.metadata["entry_point"],
        helpers=prefix,
    )
    return float(result.passed)


SCORERS: dict[str, Scorer] = {
    "numeric": score_numeric,
    "exact": score_exact,
    "code": score_code,
    "none": score_none,
}
