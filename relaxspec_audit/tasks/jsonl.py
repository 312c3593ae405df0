"""Loading a task from a JSONL file: generic (``id``, ``prompt``, ``reference``) or GSM8K.

Generic lines carry ``id``, ``prompt``, ``reference`` (optional ``split``, ``metadata``,
``scorer``); GSM8K-format lines carry ``question`` / ``answer`` ending in ``#### n``.
Errors name the file, line and field.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relaxspec_audit.tasks.scorers import _NUMBER, SCORERS, extract_answer
from relaxspec_audit.tasks.task import SPLITS, Task, TaskError, TaskItem, hash_split

#: Caps on what a task file may hold (bytes; a ``.gz`` file's are its decompressed bytes).
#: A prompt longer than any model's context is refused later; these stop a runaway file
#: (a 50 MB line, ``/dev/zero``) before it is read into memory. Override per call or with
#: the environment variables below.
MAX_LINE_BYTES = 1 << 20
MAX_FILE_BYTES = 256 << 20
LINE_ENV = "RELAXSPEC_TASK_MAX_LINE_BYTES"
FILE_ENV = "RELAXSPEC_TASK_MAX_FILE_BYTES"


def _cap(given: int | None, env: str, default: int) -> int:
    if given is not None:
        value: Any = given
    else:
        raw = os.environ.get(env)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise TaskError(f"{env}: must be a positive integer (bytes), got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TaskError(f"{env}: must be a positive integer (bytes), got {value!r}")
    return value


def _read_jsonl(
    path: Path, max_line_bytes: int | None = None, max_file_bytes: int | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line; clear errors otherwise.

    Lines are read in binary with a bound (``readline(cap + 1)``), so no line or file
    larger than its cap is ever held in memory, and decoded as strict UTF-8.
    """
    line_cap = _cap(max_line_bytes, LINE_ENV, MAX_LINE_BYTES)
    file_cap = _cap(max_file_bytes, FILE_ENV, MAX_FILE_BYTES)
    gz = path.suffix == ".gz"
    try:
        fh = gzip.open(path, "rb") if gz else open(path, "rb")
        size = os.fstat(fh.fileno()).st_size if not gz else 0
    except OSError as exc:
        raise TaskError(f"{path}: cannot open task file: {exc}") from exc
    with fh:
        if size > file_cap:
            raise TaskError(
                f"{path}: task file has {size} bytes, more than the cap of {file_cap} "
                f"(set {FILE_ENV} to raise it)"
            )
        total = 0
        lineno = 0
        while True:
            lineno += 1
            try:
                raw = fh.readline(line_cap + 1)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise TaskError(f"{path}:{lineno}: cannot read task file: {exc}") from exc
            if not raw:
                return
            total += len(raw)
            if len(raw) > line_cap:
                raise TaskError(
                    f"{path}:{lineno}: line longer than the cap of {line_cap} bytes "
                    f"(set {LINE_ENV} to raise it)"
                )
            if total > file_cap:
                raise TaskError(
                    f"{path}:{lineno}: task file longer than the cap of {file_cap} bytes "
                    f"(set {FILE_ENV} to raise it)"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TaskError(
                    f"{path}:{lineno}: not valid UTF-8 (byte {exc.start} of the line: "
                    f"{raw[exc.start : exc.start + 1]!r})"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path}:{lineno}: malformed JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise TaskError(
                    f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            yield lineno, obj


def _field(path: Path, lineno: int, obj: dict[str, Any], name: str, types: tuple[type, ...]) -> Any:
    if name not in obj:
        raise TaskError(f"{path}:{lineno}: missing field '{name}'")
    value = obj[name]
    if not isinstance(value, types) or isinstance(value, bool):
        want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise TaskError(
            f"{path}:{lineno}: field '{name}' must be {want}, got {type(value).__name__}"
        )
    return value


def _is_gsm8k(obj: dict[str, Any]) -> bool:
    return "question" in obj and "answer" in obj and "prompt" not in obj


def load_jsonl(
    path: str | Path,
    name: str | None = None,
    *,
    max_line_bytes: int | None = None,
    max_file_bytes: int | None = None,
) -> Task:
    """Load a task from a JSONL file, generic or GSM8K format (detected on line 1).

    Generic lines: ``id`` (str or int), ``prompt`` (str), ``reference`` (str, number or
    null); optional ``split`` (``discovery``/``confirmation``; default: hash of the id),
    ``metadata`` (object) and ``scorer`` (``numeric``, ``exact``, ``none``; first line
    decides, default ``numeric`` when references are numbers, else ``exact``).
    GSM8K lines: ``question`` and ``answer`` (a solution ending in ``#### n``); the
    prompt is ``Q: {question}`` / ``A:`` (two lines), the scorer extracts the final number, ids are
    ``<stem>-<line>`` unless an ``id`` field is given.

    Args:
        path: The JSONL (or ``.jsonl.gz``) file.
        name: Task name; default the file stem.
        max_line_bytes: Cap on one line in bytes (default ``$RELAXSPEC_TASK_MAX_LINE_BYTES``,
            else :data:`MAX_LINE_BYTES`).
        max_file_bytes: Cap on the file in bytes (default ``$RELAXSPEC_TASK_MAX_FILE_BYTES``,
            else :data:`MAX_FILE_BYTES`).

    Returns:
        The task.

    Raises:
        TaskError: Naming file, line and field, on malformed JSON, a missing field, a
            wrong type, a duplicate id, an unknown split, an empty file, invalid UTF-8, or
            a line or file over its cap.
    """
    path = Path(path)
    name = name or path.name.split(".")[0]
    items: list[TaskItem] = []
    seen: dict[str, int] = {}
    fmt: str | None = None
    scorer_name: str | None = None
    all_numeric = True
    for lineno, obj in _read_jsonl(path, max_line_bytes, max_file_bytes):
        if fmt is None:
            fmt = "gsm8k" if _is_gsm8k(obj) else "generic"
        if fmt == "gsm8k":
            question = _field(path, lineno, obj, "question", (str,))
            answer = _field(path, lineno, obj, "answer", (str,))
            item_id = str(obj.get("id", f"{name}-{lineno}"))
            if extract_answer(answer) is None:
                raise TaskError(f"{path}:{lineno}: field 'answer' holds no final number")
            prompt, reference, metadata = f"Q: {question}\nA:", answer, {}
        else:
            raw_id = _field(path, lineno, obj, "id", (str, int))
            item_id = str(raw_id)
            prompt = _field(path, lineno, obj, "prompt", (str,))
            ref = _field(path, lineno, obj, "reference", (str, int, float, type(None)))
            reference = None if ref is None else str(ref)
            if reference is not None and not isinstance(ref, (int, float)):
                all_numeric = all_numeric and _NUMBER.fullmatch(reference.strip()) is not None
            metadata = obj.get("metadata", {})
            if not isinstance(metadata, dict):
                raise TaskError(
                    f"{path}:{lineno}: field 'metadata' must be an object, "
                    f"got {type(metadata).__name__}"
                )
            if scorer_name is None and "scorer" in obj:
                scorer_name = _field(path, lineno, obj, "scorer", (str,))
                if scorer_name not in SCORERS:
                    raise TaskError(
                        f"{path}:{lineno}: field 'scorer' must be one of "
                        f"{sorted(SCORERS)}, got '{scorer_name}'"
                    )
        if item_id in seen:
            raise TaskError(
                f"{path}:{lineno}: field 'id': duplicate id '{item_id}' "
                f"(first seen on line {seen[item_id]})"
            )
        seen[item_id] = lineno
        split = obj.get("split")
        if split is None:
            split = hash_split(item_id)
        elif split not in SPLITS:
            raise TaskError(
                f"{path}:{lineno}: field 'split' must be one of {list(SPLITS)}, got {split!r}"
            )
        items.append(TaskItem(item_id, prompt, reference, split, metadata))
    if not items:
        raise TaskError(f"{path}: no items (empty task file)")
    if fmt == "gsm8k":
        scorer_name = "numeric"
        description = f"GSM8K-format file {path.name}; final-number match."
    else:
        if scorer_name is None:
            if all(item.reference is None for item in items):
                scorer_name = "none"
            else:
                scorer_name = "numeric" if all_numeric else "exact"
        description = f"JSONL file {path.name}; {scorer_name} scorer."
    return Task(name, items, SCORERS[scorer_name], scorer_name, description)
