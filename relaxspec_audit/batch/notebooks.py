"""Executing the bundled notebooks with papermill: where they are, what they declare, one run.

The recipe follows papermill's ``execute_notebook`` (STYLE "papermill"): reject parameters
the notebook does not declare before the kernel starts → inject → run → on a cell error
keep the failed notebook (papermill saves it with the error in it) → export HTML with code
hidden (``report.py``). :func:`check_kernel` makes sure the kernel runs this interpreter,
so the notebooks see this package.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec_audit.collect.config import REPO_ROOT

#: Where the notebooks live (they are not package data: the batch runs from a checkout).
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
#: Every notebook the batch can render, in report order.
NOTEBOOKS = ("collect", "rejection_anatomy", "fidelity", "choose_setting", "signoff")
#: The Jupyter kernel papermill starts: ipykernel's native spec runs ``sys.executable``.
KERNEL_NAME = "python3"


def notebook_path(name: str) -> Path:
    """Source path of a bundled notebook (``notebooks/<name>.ipynb``)."""
    if name not in NOTEBOOKS:
        raise ValueError(f"unknown notebook {name!r} (known: {', '.join(NOTEBOOKS)})")
    return NOTEBOOK_DIR / f"{name}.ipynb"


def notebook_parameters(name: str) -> dict[str, Any]:
    """Parameters a notebook declares in its ``parameters`` cell, with their defaults.

    Uses ``papermill.inspect_notebook`` (which parses the cell, no kernel), so unknown
    parameters are rejected before anything runs.
    """
    import papermill as pm  # lazy: heavy

    info = pm.inspect_notebook(str(notebook_path(name)))
    return {k: v.get("default") for k, v in info.items()}


@dataclass
class NotebookResult:
    """Outcome of one executed notebook.

    Attributes:
        name: notebook name.
        ok: executed without a cell error.
        ipynb: the executed (or failed) notebook.
        html: its HTML export (code hidden), None if the export itself failed.
        error: ``"<ename>: <evalue> (cell <n>)"`` when it failed.
        seconds: wall-clock time of the execution.
    """

    name: str
    ok: bool
    ipynb: Path
    html: Path | None
    error: str | None = None
    seconds: float = 0.0


def check_kernel(kernel_name: str = KERNEL_NAME) -> str:
    """Check that the Jupyter kernel runs this interpreter (where relaxspec_audit is).

    jupyter_client starts a spec whose command is ``python`` with ``sys.executable``; a
    spec pointing at another interpreter (e.g. a user-level ``python3`` kernel of the
    system python) would run the notebooks without this package.

    Returns:
        The interpreter the kernel will run.

    Raises:
        RuntimeError: no such kernel, or it runs another interpreter (with the fix).
    """
    import sys

    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    fix = f"install one for this interpreter: {sys.executable} -m ipykernel install --sys-prefix"
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel as exc:
        raise RuntimeError(f"kernel_name: no Jupyter kernel {kernel_name!r}; {fix}") from exc
    exe = spec.argv[0]
    major, minor = sys.version_info[:2]
    if exe in ("python", f"python{major}", f"python{major}.{minor}"):
        return sys.executable
    if exe == sys.executable or Path(exe).resolve() == Path(sys.executable).resolve():
        return exe
    raise RuntimeError(
        f"kernel_name: Jupyter kernel {kernel_name!r} runs {exe}, not {sys.executable}; {fix}"
    )


def execute_notebook(
    name: str,
    out_dir: str | Path,
    parameters: Mapping[str, Any],
    *,
    kernel_name: str = KERNEL_NAME,
    cwd: str | Path | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> NotebookResult:
    """Execute one notebook with papermill and export it to HTML with code hidden.

    Unknown parameters are rejected before the kernel starts. A cell error does not
    raise: papermill has saved the failed notebook (with the error in it), which is
    exported too, and the result says what failed.

    Args:
        name: notebook name (``NOTEBOOKS``).
        out_dir: folder for ``<name>.ipynb`` and ``<name>.html``.
        parameters: injected into the notebook (each must be declared by it).
        kernel_name: Jupyter kernel (default: ipykernel's native ``python3``, i.e. the
            interpreter running this function).
        cwd: working directory of the kernel.
        links: extra ``(label, href)`` pairs for the page's navigation bar (e.g. the
            task's divergence pages).

    Returns:
        The :class:`NotebookResult`.

    Raises:
        ValueError: a parameter the notebook does not declare.
    """
    import papermill as pm  # lazy: heavy

    from relaxspec_audit import report

    declared = notebook_parameters(name)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise ValueError(
            f"notebook {name!r}: unknown parameter(s) {', '.join(unknown)} "
            f"(declared: {', '.join(declared)})"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ipynb = out_dir / f"{name}.ipynb"
    error = None
    start = time.perf_counter()
    try:
        pm.execute_notebook(
            str(notebook_path(name)),
            str(ipynb),
            parameters=dict(parameters),
            kernel_name=kernel_name,
            progress_bar=False,
            cwd=str(cwd) if cwd else None,
            # ipykernel 7 warns on every start that its TCP transport is unencrypted (the
            # kernel is local and short-lived); cell errors still surface through papermill.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    except pm.PapermillExecutionError as exc:
        error = f"{exc.ename}: {exc.evalue} (cell {exc.exec_count})"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    html: Path | None = out_dir / f"{name}.html"
    try:
        report.export_html(ipynb, html, title=f"{name.replace('_', ' ')} · {out_dir.name}",
                           links=links)  # fmt: skip
    except Exception as exc:
        html = None
        error = error or f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    return NotebookResult(
        name=name, ok=error is None, ipynb=ipynb, html=html, error=error, seconds=seconds
    )
