"""Runs bound to their inputs: content hashes of the model files and the task.

A run folder is one run of one (pair, task): resuming it after the weights at a model path
were replaced, or after a task file was edited, would mix two sources under one run id.
:func:`bind_inputs` records the inputs' content hashes in the manifest and refuses such a
resume before any model is loaded or anything is written, naming what changed.

Hashes of model files are cached by (path, size, mtime, inode), since hashing gigabytes of
weights takes seconds on every resume; a file rewritten in place with the same size,
mtime and inode is not noticed (the price of the cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig


class InputsChangedError(ValueError):
    """A resume whose inputs (model files or task) differ from those the run started with."""


#: Files of a model folder that are not its weights, config or tokenizer.
_NOT_MODEL = (".md", ".lock", ".tmp")


def bind_inputs(config: RunConfig, task: Any, run_dir: Path, resume: bool) -> dict[str, Any]:
    """Content hashes of the run's inputs, checked against the run's manifest on resume.

    Each file of a local model folder (weights, config, tokenizer) is hashed; hashes are
    cached by (path, size, mtime, inode) in ``file-sha256.json`` under
    ``$RELAXSPEC_AUDIT_CACHE`` (default ``~/.cache/relaxspec_audit``), since 7 GB of
    weights take seconds. A hub id is recorded by name only. The task is bound by its
    file's sha256 (when it is a path) and by the sha256 of its items' ids and prompts.

    Raises:
        InputsChangedError: resuming a run with finished requests whose recorded inputs
            differ; names each changed model file and the task. Raised before any model
            is loaded or anything is written.
    """
    import hashlib
    import json
    import os

    from relaxspec_audit.collect import logs

    cache_path = (
        Path(os.environ.get("RELAXSPEC_AUDIT_CACHE", "~/.cache/relaxspec_audit")).expanduser()
        / "file-sha256.json"
    )
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}

    def sha256(path: Path) -> str:
        st = path.stat()
        key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns, st.st_ino]
        if key in cache and cache[key][:3] == stamp:
            return cache[key][3]
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
        cache[key] = [*stamp, h.hexdigest()]
        return h.hexdigest()

    models: dict[str, Any] = {}
    roles = [("target", config.target)]
    if config.rule != TARGET_ONLY and config.draft:
        roles.append(("draft", config.draft))
    for role, source in roles:
        folder = Path(source).expanduser()
        files = None
        if folder.is_dir():
            files = {
                f.name: sha256(f)
                for f in sorted(folder.iterdir())
                if f.is_file() and not f.name.startswith(".") and not f.name.endswith(_NOT_MODEL)
            }
        models[role] = {"source": str(source), "files": files}
    task_file = Path(str(config.task)).expanduser()
    items = hashlib.sha256(
        json.dumps([[item.id, item.prompt] for item in task.items]).encode()
    ).hexdigest()
    inputs = {
        "models": models,
        "task": {
            "file": str(task_file) if task_file.is_file() else None,
            "file_sha256": sha256(task_file) if task_file.is_file() else None,
            "items_sha256": items,
        },
    }
    try:  # a cache that cannot be written only costs time on the next run
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_path)
    except OSError:
        pass

    if not resume or not (run_dir / logs.MANIFEST).is_file():
        return inputs
    try:
        old = logs.read_manifest(run_dir).record.get("inputs")
    except logs.LogError:
        return inputs  # RunWriter refuses the folder with its own message
    if old is None or not logs.finished_request_ids(run_dir):
        return inputs  # a run from before inputs were bound, or nothing to mix with
    changed = []
    for role, now in models.items():
        was = old.get("models", {}).get(role) or {}
        a, b = was.get("files") or {}, now["files"] or {}
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                what = "added" if name not in a else "removed" if name not in b else "changed"
                changed.append(f"{role} model file {Path(now['source']) / name} {what}")
    was_task = old.get("task") or {}
    if was_task.get("file_sha256") != inputs["task"]["file_sha256"]:
        changed.append(f"task file {inputs['task']['file'] or config.task} changed")
    elif was_task.get("items_sha256") != items:
        changed.append(f"task {config.task!r} items (ids or prompts) changed")
    if changed:
        raise InputsChangedError(
            f"{run_dir}: cannot resume, inputs changed since the run started: "
            + "; ".join(changed)
            + ". Collect into a new --out folder, or pass --no-resume to start the run over"
        )
    return inputs
