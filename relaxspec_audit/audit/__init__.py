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
  (``PASS`` needs a modelled gain; else ``NO-GAIN``);
* :mod:`.runs` — a task's runs, read once from their typed manifests; reference pairing;
* :mod:`.table` — every run of a task against its reference, one row each;
* :mod:`.evidence`, :mod:`.speed_facts`, :mod:`.task_anatomy` — what a verdict's reader
  needs beside it: noise floor, attribution, likelihood, coupling, speed in words, the
  rejection anatomy;
* :mod:`.signoff` — where a task's verdicts are decided: ``audit_task`` → ``TaskAudit``;
* :mod:`.results` — the typed results; their JSON is ``summary.json``;
* :mod:`.divergences` — which outputs a relaxed rule changed, for the explorer.

The public names below, and the submodules, are imported on first use (PEP 562), so that
importing one light module of the stage (the typed results a renderer reads) does not load
polars and the log reader. Only numpy, polars, pydantic, scipy and statsmodels are
imported: no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name → the module of the stage that defines it.
_PUBLIC = {
    "accuracy_delta": "accuracy",
    "clustered_mcnemar": "accuracy",
    "score_interval": "noninferiority",
    "score_noninferiority": "noninferiority",
    "tango_ci": "noninferiority",
    "tango_noninferiority": "noninferiority",
    "DEFAULT_THETA_GRID": "anatomy",
    "SUBSETS": "anatomy",
    "TOPK": "anatomy",
    "entropy_gaps": "anatomy",
    "rejection_anatomy": "anatomy",
    "attribute_divergence": "attribution",
    "attribution_summary": "attribution",
    "counterfactual_nsd": "counterfactual",
    "coupling_gain": "coupling",
    "deviation_accounting": "fidelity",
    "deviation_by_position": "fidelity",
    "deviation_per_request": "fidelity",
    "es_index": "fidelity",
    "first_divergence": "fidelity",
    "flatten_es": "fidelity",
    "hash_divergence": "fidelity",
    "CLUSTER": "frames",
    "Frame": "frames",
    "RunFrames": "frames",
    "Scope": "frames",
    "json_safe": "frames",
    "cluster_bootstrap_ratio": "intervals",
    "clustered_ratio": "intervals",
    "clustered_share": "intervals",
    "emitted_loglik": "likelihood",
    "loglik_delta": "likelihood",
    "floor_sentence": "noise",
    "greedy_floor": "noise",
    "numeric_floor": "noise",
    "pair_requests": "pairing",
    "sample_index": "pairing",
    "planning_discordance": "power",
    "required_items_mean": "power",
    "required_items_tango": "power",
    "tango_power": "power",
    "SettingRow": "records",
    "FamilyVerdict": "results",
    "SUMMARY_SCHEMA": "results",
    "SUMMARY_SCHEMA_VERSION": "results",
    "TaskAudit": "results",
    "TaskRuns": "runs",
    "check_one_setting": "runs",
    "runs_table": "runs",
    "setting_key": "runs",
    "Status": "select",
    "Verdict": "select",
    "assign_split": "select",
    "frontier": "select",
    "needed_items": "select",
    "pass_cost": "select",
    "planning_sd": "select",
    "recommend": "select",
    "requests_speedup": "select",
    "required_items": "select",
    "setting_params": "select",
    "settings_frame": "select",
    "audit_task": "signoff",
    "family_verdicts": "signoff",
    "finish": "signoff",
    "acceptance_by_position": "speedup",
    "expected_tau": "speedup",
    "modelled_cost_per_token": "speedup",
    "modelled_speedup": "speedup",
    "modelled_speedup_paired": "speedup",
    "paired_speedup": "speedup",
    "speed": "speedup",
    "AUDIT_SCHEMA_VERSION": "summary",
    "audit_summary": "summary",
    "summary_json": "summary",
    "audit_table": "table",
    "first_divergences": "table",
    "timing_label": "walltime",
    "timing_speedups": "walltime",
    "walltime_speedup": "walltime",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    try:  # a submodule: audit.runs, audit.select, …
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the submodule exists and something it imports is missing
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
