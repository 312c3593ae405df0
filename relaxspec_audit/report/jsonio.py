"""Plain JSON out of report data: conversion to JSON types and atomic writes.

Every file a report writes (``summary.json``, a notebook's key numbers) goes through
:func:`write_json`: NaN and infinities become ``null``, numpy and torch scalars become
Python numbers, and the file is replaced atomically so a reader never sees half of it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars → Python, NaN/inf → None, paths → str."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy / torch scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "to_dicts"):  # a polars DataFrame: its records
        return _jsonable(value.to_dicts())
    if hasattr(value, "to_json"):
        text = value.to_json()
        return json.loads(text) if isinstance(text, str) else _jsonable(text)
    return str(value)


def write_json(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``data`` as indented JSON atomically (NaN becomes null); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps(_jsonable(data), indent=2, sort_keys=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def save_numbers(numbers: Mapping[str, Any], path: str | Path | None) -> dict[str, Any]:
    """Write a notebook's key numbers to ``path`` (skipped when None); return them.

    The batch runner and the tests read this file to check what a notebook showed against
    the package functions; ``python`` records the interpreter the kernel ran on.
    """
    import sys

    out = {"python": sys.executable, **_jsonable(dict(numbers))}
    if path:
        write_json(out, path)
    return out
