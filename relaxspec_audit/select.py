"""Choosing θ (NSD) or a budget (ASD) and the verdict (THEORY §3), re-exported for notebooks.

The code lives in :mod:`relaxspec_audit.audit.select`; this module re-exports it under
the documented path, so that notebooks and ``from relaxspec_audit import select`` keep
working: ``select.frontier(...)``, ``select.recommend(...)`` → :class:`Verdict`.
"""

from __future__ import annotations

from relaxspec_audit.audit.select import (
    COST_TABLE,
    DEFAULT_MIN_GAIN,
    PASS_COST,
    Status,
    Verdict,
    _fastest,  # noqa: F401  (private, used by tests/test_select.py)
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

__all__ = [
    "COST_TABLE",
    "DEFAULT_MIN_GAIN",
    "PASS_COST",
    "Status",
    "Verdict",
    "assign_split",
    "frontier",
    "needed_items",
    "pass_cost",
    "planning_sd",
    "recommend",
    "requests_speedup",
    "required_items",
    "setting_params",
    "settings_frame",
]
