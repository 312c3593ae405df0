"""Audit statistics over schema-v1 logs (THEORY §3), re-exported for notebooks.

The audit stage lives in :mod:`relaxspec_audit.audit`, one module per idea (frames,
intervals, anatomy, pairing, accuracy, fidelity, speedup, counterfactual, summary). This
module re-exports its statistics under the documented path, so that notebooks and
``from relaxspec_audit import stats`` keep working: ``stats.audit_summary(...)``,
``stats.rejection_anatomy(...)``, … (formulas in docs/STATISTICS.md).

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

from relaxspec_audit.audit.accuracy import (
    _tango_z,  # noqa: F401  (private, used by tests/test_stats.py)
    accuracy_delta,
    noninferiority_ttest,
    tango_ci,
    tango_noninferiority,
)
from relaxspec_audit.audit.anatomy import (
    DEFAULT_THETA_GRID,
    SUBSETS,
    TOPK,
    entropy_gaps,
    rejection_anatomy,
)
from relaxspec_audit.audit.counterfactual import counterfactual_nsd
from relaxspec_audit.audit.fidelity import (
    deviation_accounting,
    deviation_by_position,
    deviation_per_request,
    es_index,
    first_divergence,
    flatten_es,
    hash_divergence,
)
from relaxspec_audit.audit.frames import CLUSTER, Frame, RunFrames, Scope, json_safe
from relaxspec_audit.audit.intervals import cluster_bootstrap_ratio, clustered_ratio
from relaxspec_audit.audit.pairing import pair_requests
from relaxspec_audit.audit.speedup import (
    acceptance_by_position,
    expected_tau,
    modelled_speedup,
    paired_speedup,
    speed,
)
from relaxspec_audit.audit.summary import AUDIT_SCHEMA_VERSION, audit_summary, summary_json

# Deprecated alias of AUDIT_SCHEMA_VERSION (not logs.SCHEMA_VERSION, the log schema's).
SCHEMA_VERSION = AUDIT_SCHEMA_VERSION

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "CLUSTER",
    "DEFAULT_THETA_GRID",
    "SUBSETS",
    "TOPK",
    "Frame",
    "RunFrames",
    "Scope",
    "acceptance_by_position",
    "accuracy_delta",
    "audit_summary",
    "cluster_bootstrap_ratio",
    "clustered_ratio",
    "counterfactual_nsd",
    "deviation_accounting",
    "deviation_by_position",
    "deviation_per_request",
    "entropy_gaps",
    "es_index",
    "expected_tau",
    "first_divergence",
    "flatten_es",
    "hash_divergence",
    "json_safe",
    "modelled_speedup",
    "noninferiority_ttest",
    "pair_requests",
    "paired_speedup",
    "rejection_anatomy",
    "speed",
    "summary_json",
    "tango_ci",
    "tango_noninferiority",
]
