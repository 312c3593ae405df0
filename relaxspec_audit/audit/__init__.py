"""The audit stage: statistics over schema-v1 logs and the choice of a setting (THEORY §3).

Frames of the log tables in, small tidy polars frames out; every interval on positions
is clustered by request. One module per idea:

* :mod:`.frames` — the frame type, the cluster key, loading runs, plain JSON values;
* :mod:`.intervals` — clustered (CR1) and cluster-bootstrap intervals for ratios of sums;
* :mod:`.anatomy` — where rejected drafts lie: nucleus / top-k shares, entropy gaps;
* :mod:`.pairing` — pairing two runs' requests item by item;
* :mod:`.accuracy` — paired accuracy delta, non-inferiority and equivalence tests;
* :mod:`.fidelity` — hash divergence and deviation accounting (the coupling bound);
* :mod:`.speedup` — τ, acceptance, modelled and paired speedups;
* :mod:`.counterfactual` — the first-order NSD sweep replayed from one ``exact`` run;
* :mod:`.summary` — all of the above as one JSON-ready dict (``audit_summary``);
* :mod:`.select` — frontier, non-inferior choice, discovery → confirmation, ``Verdict``.

Only numpy, polars, scipy and statsmodels are imported (scipy and statsmodels inside
functions): no torch.
"""

from __future__ import annotations

from relaxspec_audit.audit.accuracy import (
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
from relaxspec_audit.audit.select import (
    Status,
    Verdict,
    assign_split,
    frontier,
    planning_sd,
    recommend,
    required_items,
    setting_params,
    settings_frame,
)
from relaxspec_audit.audit.speedup import (
    acceptance_by_position,
    expected_tau,
    modelled_speedup,
    paired_speedup,
    speed,
)
from relaxspec_audit.audit.summary import AUDIT_SCHEMA_VERSION, audit_summary, summary_json

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "CLUSTER",
    "DEFAULT_THETA_GRID",
    "SUBSETS",
    "TOPK",
    "Frame",
    "RunFrames",
    "Scope",
    "Status",
    "Verdict",
    "acceptance_by_position",
    "accuracy_delta",
    "assign_split",
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
    "frontier",
    "hash_divergence",
    "json_safe",
    "modelled_speedup",
    "noninferiority_ttest",
    "pair_requests",
    "paired_speedup",
    "planning_sd",
    "recommend",
    "rejection_anatomy",
    "required_items",
    "setting_params",
    "settings_frame",
    "speed",
    "summary_json",
    "tango_ci",
    "tango_noninferiority",
]
