"""Verification rules, their parameters and registry: the public entry point.

Re-exports the verification stage (:mod:`relaxspec_audit.verify`) under the path notebooks
and users import: ``rules.RULES``, ``rules.make_params``, ``rules.simulate_position``,
``rules.asd_accept_length``, ``rules.Cause``, ``rules.Block``, ``rules.token_stats``, …
See docs/ARCHITECTURE.md for where each name lives.
"""

from relaxspec_audit.verify.block import DIAG_KEYS, TOKEN_STAT_KEYS, Block, BlockResult, Cause
from relaxspec_audit.verify.diagnostics import es_grid, token_stats
from relaxspec_audit.verify.params import (
    DEFAULT_THETA,
    AsdParams,
    ExactParams,
    FuzzyParams,
    GreedyParams,
    MarginParams,
    NucleusParams,
    TopkParams,
    TypicalParams,
)
from relaxspec_audit.verify.registry import (
    RULES,
    TARGET_ONLY,
    RuleSpec,
    make_params,
    resolve_params,
    setting_label,
)
from relaxspec_audit.verify.simulate import asd_accept_length, simulate_position

__all__ = [
    "DEFAULT_THETA",
    "DIAG_KEYS",
    "RULES",
    "TARGET_ONLY",
    "TOKEN_STAT_KEYS",
    "AsdParams",
    "Block",
    "BlockResult",
    "Cause",
    "ExactParams",
    "FuzzyParams",
    "GreedyParams",
    "MarginParams",
    "NucleusParams",
    "RuleSpec",
    "TopkParams",
    "TypicalParams",
    "asd_accept_length",
    "es_grid",
    "make_params",
    "resolve_params",
    "setting_label",
    "simulate_position",
    "token_stats",
]
