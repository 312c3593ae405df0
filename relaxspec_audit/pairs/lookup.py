"""Finding a model a config names: a local folder, the repository's own, or a cached hub id.

Audits run offline, so a model must already be here: a folder (as given, ``~`` expanded,
or relative to the repository, which is how the bundled configs name the embedded pair
``data/models/arith/{target,draft}``), or a hub id (``owner/name``) whose ``config.json``
is in the local Hugging Face cache. Nothing is downloaded.
"""

from __future__ import annotations

import re
from pathlib import Path

from relaxspec_audit.collect.config import REPO_ROOT


def resolve_model(value: str) -> str | None:
    """Where the model ``value`` is: an absolute folder, the cached hub id, or None.

    Args:
        value: a folder path or a hub id, as written in a config.

    Returns:
        The resolved absolute folder for a local model, ``value`` itself for a hub id
        cached here, None when neither exists.
    """
    for candidate in (Path(value).expanduser(), REPO_ROOT / value):
        if candidate.is_dir():
            return str(candidate.resolve())
    if re.fullmatch(r"[\w.-]+/[\w.-]+", value):
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(value, "config.json")
        except Exception:
            hit = None
        if isinstance(hit, str):
            return value
    return None
