"""Reports: pages, markdown, tables and figures rendered from the audit's typed results.

The report stage decides nothing and reads no log: it renders what
:mod:`relaxspec_audit.audit` computed — a :class:`~relaxspec_audit.audit.results.TaskAudit`
(``summary.json``), the audit table's frames, the explorer's data. One module per idea:

- :mod:`.markdown`: the notebooks' markdown (choices, sign-off, manifest facts);
- :mod:`.export`: HTML export of executed notebooks, the batch's ``index.html``, a static
  sign-off page from a ``summary.json`` alone;
- :mod:`.explorer`: the divergence explorer's page and a one-request view;
- :mod:`.tables`: CSV and markdown tables of an audit summary and of a task audit;
- :mod:`.format`: the short text of numbers shared by the pages;
- :mod:`.jsonio`: a notebook's key numbers as JSON;
- :mod:`.plots`: matplotlib figures (imported on its own: ``from relaxspec_audit.report
  import plots``).

Importing the package imports no heavy library (matplotlib, nbconvert and mistune load
inside the functions that need them).
"""

from __future__ import annotations

from relaxspec_audit.report.explorer import divergence_page, request_view
from relaxspec_audit.report.export import anatomy_line, export_html, signoff_page, write_index
from relaxspec_audit.report.jsonio import save_numbers, write_json
from relaxspec_audit.report.markdown import choices_markdown, manifest_markdown, signoff_markdown
from relaxspec_audit.report.tables import family_rows, write_summary_csv

__all__ = [
    "anatomy_line",
    "choices_markdown",
    "divergence_page",
    "export_html",
    "family_rows",
    "manifest_markdown",
    "request_view",
    "save_numbers",
    "signoff_markdown",
    "signoff_page",
    "write_index",
    "write_json",
    "write_summary_csv",
]
