"""Notebook parameter checks: a report notebook refuses bad or undeclared parameters.

papermill only warns about an unknown parameter; the notebooks' validation cell calls
:func:`validate_parameters`, which raises naming the first bad one. The batch config
(``batch.load_config``) and ``relaxspec-audit audit`` call the same checker on their
values before any work, so a value a notebook would refuse never reaches collection.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from relaxspec_audit.verify.params import bad_thetas
from relaxspec_audit.verify.registry import RULES, TARGET_ONLY

_SPLITS = ("discovery", "confirmation")
# The checkout a notebook's relative ``runs_dir`` falls back to: the folder holding the
# package's pyproject.toml (an editable install), so that "runs" names the same folder
# from the repository root and from notebooks/.
_REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_runs_dir(runs_dir: str | Path) -> str | Path:
    """``runs_dir`` as given if it exists, else relative to the repository root.

    A notebook's default ``runs_dir = "runs"`` is relative to the kernel's working
    folder, which is ``notebooks/`` under ``make lab`` and the repository root when a
    notebook is run from there (papermill, the batch); both must find the same runs. An
    absolute path, or one found nowhere, is returned unchanged (the check then names it).
    Falling back to the repository's folder is said on stderr, so that a notebook run
    from elsewhere never audits the checkout's runs silently. An object-store URL
    (``s3://…``) is returned unchanged: the reader opens it.
    """
    if _is_url(runs_dir):
        return runs_dir
    path = Path(runs_dir)
    if path.is_absolute() or path.is_dir() or not str(runs_dir):
        return runs_dir
    in_repo = _REPO_ROOT / path
    if in_repo.is_dir() and (_REPO_ROOT / "pyproject.toml").is_file():
        import sys

        print(f"runs_dir: {runs_dir!r} is not under {Path.cwd()}; using {in_repo}",
              file=sys.stderr)  # fmt: skip
        return str(in_repo)
    return runs_dir


def validate_parameters(**params: Any) -> None:
    """Check a notebook's parameters; raise naming the first bad one.

    Known names: ``runs_dir`` (an existing folder with runs of ``task``, found by
    :func:`resolve_runs_dir`), ``task``,
    ``ni_margin`` (the non-inferiority margin δ, a fraction of the score in [0, 1):
    0.02 = 2 points), ``alpha`` (in (0, 1)), ``min_gain`` (≥ 0: the lower bound of the
    modelled speed-up PASS needs), ``thetas`` (None: the runs' logged grid;
    else non-empty, each in (0, 1]), ``split`` / ``discovery`` / ``confirmation`` (a split
    name), ``numbers_path`` (str), ``collect`` (bool),
    ``limit`` / ``k`` / ``max_new_tokens`` (int ≥ 1), ``seed`` (int ≥ 0). Unknown names
    are an error too (``margin``, the old name of ``ni_margin``, says so).

    Raises:
        ValueError: ``"<name>: <what is wrong>, got <value>"``.
    """

    def bad(name: str, what: str) -> None:
        raise ValueError(f"{name}: {what}, got {params[name]!r}")

    if isinstance(params.get("runs_dir"), str | Path) and params.get("collect") is not True:
        params["runs_dir"] = resolve_runs_dir(params["runs_dir"])
    for name, value in params.items():
        if name == "runs_dir":
            if not isinstance(value, str | Path) or not value:
                bad(name, "must be a folder")
            local = not _is_url(value)  # a URL's runs are checked by runs_table below
            if params.get("collect") is not True and local and not Path(value).is_dir():
                bad(name, "must be an existing folder of run folders")
        elif name == "task":
            if not isinstance(value, str) or not value:
                bad(name, "must be a task name")
        elif name == "rule":
            if value not in (*RULES, TARGET_ONLY):
                bad(name, "must be a rule name")
        elif name == "ni_margin":
            # A fraction, not points: 5 would be a margin of 500 points and pass everything.
            if not _number(value) or not 0 <= value < 1:
                bad(name, "must be a number >= 0 and < 1, in score units (0.02 = 2 points)")
        elif name == "alpha":
            if not _number(value) or not 0 < value < 1:
                bad(name, "must be in (0, 1)")
        elif name == "min_gain":
            if not _number(value) or value < 0:
                bad(name, "must be a number >= 0 (the minimum modelled speed-up; 1.0 = faster)")
        elif name == "thetas":
            if value is None:  # the grid the runs logged E_S on
                continue
            if not isinstance(value, list | tuple) or not value:
                bad(name, "must be None or a non-empty list")
            if wrong := bad_thetas(value):
                bad(name, f"every θ must be in (0, 1] ({wrong[0]!r} is not)")
        elif name in ("split", "discovery", "confirmation"):
            if value not in _SPLITS:
                bad(name, f"must be one of {_SPLITS}")
        elif name == "numbers_path":
            if not isinstance(value, str | Path):
                bad(name, "must be a path or ''")
        elif name == "collect":
            if not isinstance(value, bool):
                bad(name, "must be True or False")
        elif name in ("limit", "k", "max_new_tokens", "seed"):
            low = 0 if name == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                bad(name, f"must be an integer >= {low}")
        elif name == "splits":
            if not isinstance(value, list | tuple) or not value:
                bad(name, f"must be a non-empty list of {_SPLITS}")
            if any(s not in _SPLITS for s in value):
                bad(name, f"must be a non-empty list of {_SPLITS}")
        elif name == "rules":
            if not isinstance(value, list) or not value:
                bad(name, "must be a non-empty list of rule entries")
        elif name == "margin":
            raise ValueError("margin: unknown notebook parameter (renamed ni_margin)")
        else:
            raise ValueError(f"{name}: unknown notebook parameter")
    if "runs_dir" in params and "task" in params and params.get("collect") is not True:
        from relaxspec_audit.audit.runs import runs_table
        from relaxspec_audit.collect import logs

        try:
            n = runs_table(params["runs_dir"], params["task"]).height
        except logs.LogError as exc:
            raise ValueError(f"runs_dir: {exc}") from exc
        if n == 0:
            raise ValueError(
                f"task: no runs of task {params['task']!r} under runs_dir {params['runs_dir']!r}"
            )


def _is_url(value: Any) -> bool:
    """An object-store URL (``s3://…``): the reader's to open, not a local folder."""
    from relaxspec_audit.collect.storage import is_remote  # polars: only when checked

    return isinstance(value, str | Path) and is_remote(value)


def _number(value: Any) -> bool:
    """A finite int or float (not a bool, which is an int to Python)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
