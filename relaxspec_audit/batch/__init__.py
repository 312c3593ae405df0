"""Batch audits: config loading, validation and planning, notebook execution, the runner.

``batch.loading`` reads a YAML batch config within limits and with line numbers,
``batch.validation`` checks all of it, ``batch.plan`` holds the per-task plans it expands
into (with the coupling, noise-floor and timing keys), ``batch.notebooks`` executes one
bundled notebook with papermill, ``batch.runner`` collects the missing runs and renders
every task's reports. The public API is re-exported here.
"""

from relaxspec_audit.batch.calibration import calibrate_batch
from relaxspec_audit.batch.loading import BatchConfigError
from relaxspec_audit.batch.notebooks import (
    KERNEL_NAME,
    NOTEBOOK_DIR,
    NOTEBOOKS,
    NotebookResult,
    check_kernel,
    execute_notebook,
    notebook_parameters,
    notebook_path,
)
from relaxspec_audit.batch.parameters import resolve_runs_dir, validate_parameters
from relaxspec_audit.batch.plan import DEFAULT_NOTEBOOKS, BatchConfig, TaskPlan
from relaxspec_audit.batch.runner import (
    BatchResult,
    TaskResult,
    collect_runs,
    run_batch,
    runs_root,
)
from relaxspec_audit.batch.validation import (
    BATCH_PARAMETERS,
    BATCH_SCHEMA_VERSION,
    CONFIG_DIR,
    bundled_config,
    load_config,
    plan_task,
)

__all__ = [
    "BATCH_PARAMETERS",
    "BATCH_SCHEMA_VERSION",
    "CONFIG_DIR",
    "DEFAULT_NOTEBOOKS",
    "KERNEL_NAME",
    "NOTEBOOKS",
    "NOTEBOOK_DIR",
    "BatchConfig",
    "BatchConfigError",
    "BatchResult",
    "NotebookResult",
    "TaskPlan",
    "TaskResult",
    "bundled_config",
    "calibrate_batch",
    "check_kernel",
    "collect_runs",
    "execute_notebook",
    "load_config",
    "notebook_parameters",
    "notebook_path",
    "plan_task",
    "resolve_runs_dir",
    "run_batch",
    "runs_root",
    "validate_parameters",
]
