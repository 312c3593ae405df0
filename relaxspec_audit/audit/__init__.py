"""The audit stage: statistics over schema-v1 logs and the choice of a setting (THEORY §3).

Frames of the log tables in, small tidy polars frames out; every interval on positions
is clustered by request. One module per idea:

* :mod:`.frames` — the frame type, the cluster key, loading runs, plain JSON values;
* :mod:`.intervals` — clustered (CR1) and cluster-bootstrap intervals for ratios of sums;
* :mod:`.anatomy` — where rejected drafts lie: nucleus / top-k shares, entropy gaps;
* :mod:`.pairing` — pairing two runs' requests item by item;
* :mod:`.noninferiority` — score tests against a margin: Tango's, and on item means;
* :mod:`.accuracy` — paired accuracy delta, non-inferiority and equivalence tests;
* :mod:`.fidelity` — hash divergence and deviation accounting (the coupling bound);
* :mod:`.speedup` — τ, acceptance, the modelled speed-up (counts × cost table), the
  collection's wall-clock speed-up;
* :mod:`.walltime` — the paired timing pass's wall-clock speed-up with run-to-run noise;
* :mod:`.counterfactual` — the first-order NSD sweep replayed from one ``exact`` run;
* :mod:`.likelihood` — emitted-token log-likelihood under the target, paired delta;
* :mod:`.attribution` — why each first divergence happened: the rule or numerics;
* :mod:`.noise` — the noise floor: greedy vs target-only, one reference two ways;
* :mod:`.coupling` — what the shared random stream buys in items;
* :mod:`.power` — items needed by the test that is run (Tango, the score test on means);
* :mod:`.summary` — all of the above as one JSON-ready dict (``audit_summary``);
* :mod:`.select` — frontier, non-inferior choice, discovery → confirmation, ``Verdict``
  (``PASS`` needs a modelled gain; else ``NO-GAIN``).

Only numpy, polars, scipy and statsmodels are imported (scipy and statsmodels inside
functions): no torch.
"""

from __future__ import annotations

from relaxspec_audit.audit.accuracy import accuracy_delta, clustered_mcnemar
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
from relaxspec_audit.audit.noninferiority import (
    score_interval,
    score_noninferiority,
    tango_ci,
    tango_noninferiority,
)
from relaxspec_audit.audit.pairing import pair_requests, sample_index
from relaxspec_audit.audit.power import (
    planning_discordance,
    required_items_mean,
    required_items_tango,
    tango_power,
)
from relaxspec_audit.audit.select import (
    Status,
    Verdict,
    assign_split,
    frontier,
    needed_items,
    pass_cost,
    planning_sd,
    recommend,
    requests_speedup,
    required_items,
    setting_params,
    settings_frame,
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
from relaxspec_audit.audit.walltime import timing_label, timing_speedups, walltime_speedup

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
    "frontier",
    "greedy_floor",
    "hash_divergence",
    "json_safe",
    "loglik_delta",
    "modelled_cost_per_token",
    "modelled_speedup",
    "modelled_speedup_paired",
    "needed_items",
    "numeric_floor",
    "pair_requests",
    "paired_speedup",
    "pass_cost",
    "planning_discordance",
    "planning_sd",
    "recommend",
    "rejection_anatomy",
    "requests_speedup",
    "required_items",
    "required_items_mean",
    "required_items_tango",
    "sample_index",
    "score_interval",
    "score_noninferiority",
    "setting_params",
    "settings_frame",
    "speed",
    "summary_json",
    "tango_ci",
    "tango_noninferiority",
    "tango_power",
    "timing_label",
    "timing_speedups",
    "walltime_speedup",
]
