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
    clustered_mcnemar,
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
from relaxspec_audit.audit.attribution import attribute_divergence, attribution_summary
from relaxspec_audit.audit.counterfactual import counterfactual_nsd
from relaxspec_audit.audit.coupling import coupling_gain
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
from relaxspec_audit.audit.intervals import (
    cluster_bootstrap_ratio,
    clustered_ratio,
    clustered_share,
)
from relaxspec_audit.audit.likelihood import emitted_loglik, loglik_delta
from relaxspec_audit.audit.noise import floor_sentence, greedy_floor, numeric_floor
from relaxspec_audit.audit.pairing import pair_requests, sample_index
from relaxspec_audit.audit.power import (
    planning_discordance,
    required_items_mean,
    required_items_tango,
    tango_power,
)
from relaxspec_audit.audit.speedup import (
    acceptance_by_position,
    expected_tau,
    modelled_cost_per_token,
    modelled_speedup,
    modelled_speedup_paired,
    paired_speedup,
    speed,
)
from relaxspec_audit.audit.summary import AUDIT_SCHEMA_VERSION, audit_summary, summary_json
from relaxspec_audit.audit.walltime import timing_speedups, walltime_speedup

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
    "attribute_divergence",
    "attribution_summary",
    "audit_summary",
    "cluster_bootstrap_ratio",
    "clustered_mcnemar",
    "clustered_ratio",
    "clustered_share",
    "counterfactual_nsd",
    "coupling_gain",
    "deviation_accounting",
    "deviation_by_position",
    "deviation_per_request",
    "emitted_loglik",
    "entropy_gaps",
    "es_index",
    "expected_tau",
    "first_divergence",
    "flatten_es",
    "floor_sentence",
    "greedy_floor",
    "hash_divergence",
    "json_safe",
    "loglik_delta",
    "modelled_cost_per_token",
    "modelled_speedup",
    "modelled_speedup_paired",
    "noninferiority_ttest",
    "numeric_floor",
    "pair_requests",
    "paired_speedup",
    "planning_discordance",
    "rejection_anatomy",
    "required_items_mean",
    "required_items_tango",
    "sample_index",
    "speed",
    "summary_json",
    "tango_ci",
    "tango_noninferiority",
    "tango_power",
    "timing_speedups",
    "walltime_speedup",
]
