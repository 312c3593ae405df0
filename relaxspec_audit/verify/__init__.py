"""Stage 1, verification: the rules, their typed parameters and registry, their theory.

``params`` (typed rule parameters), ``registry`` (:data:`RULES`, resolved parameters),
``block`` (a rule's inputs, outputs and causes), ``rules`` (the rule functions),
``diagnostics`` (per-token statistics, E_S), ``simulate`` (one position or block from
plain arrays), ``theory`` (exact single-position laws, numpy), ``rng`` (keyed randomness).
"""
