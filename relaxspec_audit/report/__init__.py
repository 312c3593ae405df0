"""Reports: audit rows, the verdict per rule, ``summary.json``, HTML pages, figures.

The public API is re-exported here from one small module per idea:

- :mod:`.runs`: the runs of a task from their manifests, and reference pairing;
- :mod:`.audits`: audit rows of every relaxed run against its reference;
- :mod:`.summary`: the verdict per relaxed rule and ``summary.json``;
- :mod:`.markdown`: the notebooks' markdown (choices, sign-off, manifest facts);
- :mod:`.export`: HTML export of executed notebooks and the batch's ``index.html``;
- :mod:`.parameters`: notebook parameter checks;
- :mod:`.jsonio`: JSON conversion and atomic writes;
- :mod:`.format`: the short text of numbers shared by the pages;
- :mod:`.plots`: matplotlib figures (imported on its own: ``from relaxspec_audit.report
  import plots``).

Importing the package imports no heavy library (polars, matplotlib, nbconvert load inside
the functions that need them).
"""

from __future__ import annotations

from relaxspec_audit.report.audits import _mean_score as _mean_score
from relaxspec_audit.report.audits import audit_table, first_divergences
from relaxspec_audit.report.explorer import divergence_page, request_view
from relaxspec_audit.report.export import _CSS as _CSS
from relaxspec_audit.report.export import _page as _page
from relaxspec_audit.report.export import export_html, write_index
from relaxspec_audit.report.format import _fmt as _fmt
from relaxspec_audit.report.format import _now as _now
from relaxspec_audit.report.format import _pct as _pct
from relaxspec_audit.report.format import _points as _points
from relaxspec_audit.report.format import _setting as _setting
from relaxspec_audit.report.format import _speed as _speed
from relaxspec_audit.report.jsonio import _jsonable as _jsonable
from relaxspec_audit.report.jsonio import save_numbers, write_json
from relaxspec_audit.report.markdown import choices_markdown, manifest_markdown, signoff_markdown
from relaxspec_audit.report.parameters import _SPLITS as _SPLITS
from relaxspec_audit.report.parameters import resolve_runs_dir, validate_parameters
from relaxspec_audit.report.runs import _PAIR_FIELDS as _PAIR_FIELDS
from relaxspec_audit.report.runs import (
    LOSSLESS,
    check_one_setting,
    label_runs,
    manifest_facts,
    reference_rule,
    run_dirs,
    runs_overview,
    runs_table,
    setting_key,
    setting_label,
    split_note,
)
from relaxspec_audit.report.runs import _baseline as _baseline
from relaxspec_audit.report.runs import _match as _match
from relaxspec_audit.report.summary import (
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_VERSION,
    finish_summary,
    recommend,
    task_summary,
)
from relaxspec_audit.report.summary import _first as _first
from relaxspec_audit.report.summary import _public as _public
from relaxspec_audit.report.summary import _setting_row as _setting_row

__all__ = [
    "LOSSLESS",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMA_VERSION",
    "audit_table",
    "check_one_setting",
    "choices_markdown",
    "divergence_page",
    "export_html",
    "finish_summary",
    "first_divergences",
    "label_runs",
    "manifest_facts",
    "manifest_markdown",
    "recommend",
    "reference_rule",
    "request_view",
    "resolve_runs_dir",
    "run_dirs",
    "runs_overview",
    "runs_table",
    "save_numbers",
    "setting_key",
    "setting_label",
    "signoff_markdown",
    "split_note",
    "task_summary",
    "validate_parameters",
    "write_index",
    "write_json",
]
