"""Stage 1, verification: the rules, their typed parameters and registry, their theory.

``params`` (typed rule parameters), ``registry`` (:data:`RULES`, resolved parameters),
``block`` (a rule's inputs, outputs and causes), ``rules`` (the rule functions),
``diagnostics`` (per-token statistics, E_S), ``simulate`` (one position or block from
plain arrays), ``theory`` (exact single-position laws, numpy), ``rng`` (keyed randomness).

The stage's public names are importable from here (``from relaxspec_audit import verify``:
``verify.RULES``, ``verify.make_params``, ``verify.simulate_position``, ``verify.Cause``, …);
torch is imported only when a rule runs.
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
