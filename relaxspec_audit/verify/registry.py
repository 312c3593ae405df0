"""The rule registry: everything the pipeline knows about a verification rule, in one place.

A :class:`RuleSpec` names the rule's function and its typed parameters
(:mod:`relaxspec_audit.verify.params`), and says how the audit treats it: which lossless
rule it is judged against, which parameter the frontier sweeps, which audit measures apply.
The CLI's rule options, batch-config validation, setting labels, the run id and the
audit's settings frame are all derived from :data:`RULES`; adding a rule here is all it
takes to collect, validate, label and audit it.

Parameters are resolved once (:func:`resolve_params`: defaults filled in, values checked)
and carried resolved from then on.

Importable without torch: the rule functions import it only when they run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from relaxspec_audit.verify import rules as _rules
from relaxspec_audit.verify.params import (
    DEFAULT_THETA,
    AsdParams,
    ExactParams,
    FuzzyParams,
    GreedyParams,
    MarginParams,
    NucleusParams,
    ParamInfo,
    TopkParams,
    TypicalParams,
)

__all__ = [
    "LOSSLESS",
    "NSD_DEVIATION",
    "RULES",
    "TARGET_ONLY",
    "CliOption",
    "Param",
    "RuleSpec",
    "check_greedy",
    "cli_options",
    "default_temperature",
    "make_params",
    "params_dict",
    "params_from_options",
    "resolve_params",
    "setting_label",
    "setting_words",
]

#: Pseudo-rule name for target-only autoregressive decoding (the speed baseline and the
#: greedy noise floor); it has no draft and no parameters, so it is not in :data:`RULES`.
TARGET_ONLY = "target"
#: Audit measure: deviation accounting against NSD's ``(1 − ε)^T`` bound (THEORY §2.3, §3).
#: It applies only where the rule's θ is a nucleus mass and TV(P, p) = E_S holds.
NSD_DEVIATION = "nsd_deviation"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a rule: the params field, its default and presentation."""

    name: str
    default: Any
    type: type
    info: ParamInfo

    @property
    def flag(self) -> str:
        """The CLI option's Python name (``--top-k-accept`` → ``top_k_accept``)."""
        return self.info.flag or self.name


@dataclasses.dataclass(frozen=True)
class RuleSpec:
    """A registered verification rule.

    Attributes:
        name: Rule name as in THEORY §2 and the logs.
        fn: ``fn(block, params, state) -> BlockResult`` (:mod:`relaxspec_audit.verify.rules`).
        params_cls: Frozen params dataclass (build with :func:`resolve_params`).
        greedy_only: The rule always verifies greedily (decode at temperature 0).
        reference: The lossless rule it is judged against (THEORY §3); None: ``greedy`` at
            temperature 0, else ``exact``.
        knob: The parameter a setting is chosen over (the frontier's x); None: lossless.
        nucleus_param: The parameter that is a nucleus mass θ (``in_nucleus`` is logged at
            it); None: :data:`DEFAULT_THETA`.
        measures: Audit measures beyond the common ones (:data:`NSD_DEVIATION`).
        lossless: A reference rule, never audited as relaxed.
        own_recovery: Its recovery token is the rule's own draw (``typical`` recovers
            with the target argmax, ``fuzzy`` samples p itself), not the residual of the
            ratio test: a first divergence at a recovery is the rule's, not numerics'.
        ratio_test: Its rejections are the lossless ratio test's ``u < min(1, p/q)``
            (THEORY §2.1), the ones the rejection anatomy dissects when sampled.
        summary: One line for ``--help`` and the docs.
    """

    name: str
    fn: Callable[..., Any]
    params_cls: type
    greedy_only: bool = False
    reference: str | None = None
    knob: str | None = None
    nucleus_param: str | None = None
    measures: frozenset[str] = frozenset()
    lossless: bool = False
    own_recovery: bool = False
    ratio_test: bool = False
    summary: str = ""

    @property
    def params(self) -> tuple[Param, ...]:
        """The rule's parameters in declaration order (the order of labels and settings)."""
        return tuple(
            Param(f.name, f.default, _field_type(f), f.metadata["param"])
            for f in dataclasses.fields(self.params_cls)
        )

    @property
    def param_names(self) -> tuple[str, ...]:
        """The parameters' names in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self.params_cls))

    def reference_for(self, temperature: float) -> str:
        """The lossless rule this one is judged against at ``temperature`` (THEORY §3)."""
        if self.lossless:
            return self.name
        return self.reference or ("greedy" if temperature == 0 else "exact")

    def nucleus_theta(self, params: Any) -> float:
        """θ at which ``in_nucleus`` is logged: the rule's nucleus mass, else the default."""
        return float(getattr(params, self.nucleus_param)) if self.nucleus_param else DEFAULT_THETA


def _field_type(f: dataclasses.Field) -> type:
    # Annotations are strings under `from __future__ import annotations`.
    text = str(f.type)
    if text.startswith("int"):
        return int
    return {"float": float, "str": str}.get(text, float)


RULES: dict[str, RuleSpec] = {
    spec.name: spec
    for spec in (
        RuleSpec("exact", _rules.rule_exact, ExactParams, lossless=True, ratio_test=True,
                 summary="lossless speculative sampling (Leviathan et al. 2023)"),
        RuleSpec("greedy", _rules.rule_greedy, GreedyParams, greedy_only=True, lossless=True,
                 summary="strict greedy verification: the target's own greedy output"),
        RuleSpec("nucleus", _rules.rule_nucleus, NucleusParams, reference="exact",
                 knob="theta", nucleus_param="theta", measures=frozenset({NSD_DEVIATION}),
                 summary="NSD: also accept drafts inside the target's top-θ nucleus"),
        RuleSpec("asd", _rules.rule_asd, AsdParams, greedy_only=True, reference="greedy",
                 knob="budget", summary="ASD: low-regret greedy mismatches under a budget"),
        RuleSpec("typical", _rules.rule_typical, TypicalParams, knob="epsilon", own_recovery=True,
                 summary="typical acceptance (Medusa)"),
        RuleSpec("fuzzy", _rules.rule_fuzzy, FuzzyParams, knob="threshold", own_recovery=True,
                 summary="fuzzy: accept while D(p‖q) ≤ T"),
        RuleSpec("margin", _rules.rule_margin, MarginParams, knob="logit_ratio",
                 summary="margin-aware: top-2 drafts where the target is undecided"),
        RuleSpec("topk", _rules.rule_topk, TopkParams, knob="top_k",
                 summary="accept drafts in the target's top k with p(x) ≥ r·max p"),
    )
}  # fmt: skip
#: Rules that are references or baselines, never audited as relaxed.
LOSSLESS = (*(name for name, spec in RULES.items() if spec.lossless), TARGET_ONLY)


def _spec(rule: str) -> RuleSpec:
    if rule not in RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; known: {sorted(RULES)}")
    return RULES[rule]


def resolve_params(rule: str, raw: Any = None) -> Any:
    """The rule's frozen params from a mapping of overrides (or params already resolved).

    Defaults fill what ``raw`` leaves out, so ``{}`` and ``{"theta": 0.95}`` resolve to the
    same object.

    Args:
        rule: Rule name (key of :data:`RULES`).
        raw: Mapping of parameter overrides, None, or an instance of the params class.

    Raises:
        ValueError: Unknown rule, unknown parameter or invalid value; the message names the
            field, e.g. ``"theta: must be in (0, 1], got 1.5"``.
    """
    spec = _spec(rule)
    if isinstance(raw, spec.params_cls):
        return raw
    kw = dict(raw or {})
    unknown = sorted(set(kw) - set(spec.param_names))
    if unknown:
        known = sorted(spec.param_names) or "none"
        raise ValueError(f"{unknown[0]}: unknown parameter of rule {rule!r}; known: {known}")
    return spec.params_cls(**kw)


def make_params(rule: str, **kw: Any) -> Any:
    """Build a rule's frozen params from keyword overrides of its defaults.

    The keyword form of :func:`resolve_params` (the public name notebooks use).
    """
    return resolve_params(rule, kw)


def params_dict(params: Any) -> dict[str, Any]:
    """Canonical plain dict of resolved params, in declaration order (for JSON and hashing)."""
    if params is None:
        return {}
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


def setting_label(rule: str, params: Any = None) -> str:
    """Short label of a setting: ``nucleus θ=0.9``, ``asd B=8 g=0.25 M=2``, ``exact``.

    ``params`` may be resolved or a mapping of overrides; every parameter is shown, in
    declaration order, with its symbol.
    """
    if rule not in RULES:
        return rule
    values = params_dict(resolve_params(rule, params))
    if not values:
        return rule
    info = {p.name: p.info for p in RULES[rule].params}
    parts = [f"{info[k].symbol}={_fmt(v)}" for k, v in values.items()]
    return f"{rule} " + " ".join(parts)


def setting_words(params: Mapping[str, Any]) -> str:
    """A setting's parameters in words for a sentence: ``θ = 0.9``, ``B = 2, g = 0.25, M = 2``.

    Each name takes its symbol from the rule that declares it (a parameter name means one
    thing across rules: ``theta`` is only a nucleus mass); an unknown name stays as it is.
    """
    symbols = {p.name: p.info.symbol for spec in RULES.values() for p in spec.params}
    return ", ".join(f"{symbols.get(k, k)} = {_fmt(v)}" for k, v in params.items())


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "∞" if value == math.inf else f"{value:g}"
    return str(value)


def check_greedy(spec: RuleSpec, temperature: float) -> str | None:
    """Why ``spec`` cannot run at ``temperature`` (None when it can)."""
    if spec.greedy_only and temperature != 0:
        return (
            f"rule {spec.name!r} is greedy-only (THEORY §2); set temperature 0, got {temperature}"
        )
    return None


def default_temperature(rule: str) -> float:
    """Greedy-only rules (and target-only decoding, the greedy baseline) default to T = 0."""
    spec = RULES.get(rule)
    return 0.0 if spec is not None and spec.greedy_only else 1.0


@dataclasses.dataclass(frozen=True)
class CliOption:
    """One command-line option shared by every rule that takes it (``--theta``, ``--cap``)."""

    flag: str
    type: type
    choices: tuple[str, ...]
    help: str


def cli_options() -> dict[str, CliOption]:
    """Every rule parameter's CLI option, by option name, from :data:`RULES`.

    Rules that share an option name share the option (its help lists each rule's use); a
    deprecated spelling is an option too, mapped by :func:`params_from_options`.

    Raises:
        TypeError: two rules give one option name different types.
    """
    kinds: dict[str, tuple[type, tuple[str, ...]]] = {}
    helps: dict[str, list[str]] = {}
    for spec in RULES.values():
        for p in spec.params:
            kind = (p.type, p.info.choices)
            if kinds.setdefault(p.flag, kind) != kind:
                raise TypeError(f"--{p.flag}: {kinds[p.flag]} in one rule, {kind} in another")
            helps.setdefault(p.flag, []).append(f"{p.info.help} [{p.info.unit}]")
    return {
        flag: CliOption(flag, kind[0], kind[1], "; ".join(helps[flag]))
        for flag, kind in kinds.items()
    }


def params_from_options(rule: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Map given CLI options (``None`` = not given) to ``rule``'s parameter overrides.

    Raises:
        ValueError: an option that is not a parameter of ``rule``, naming its flag.
    """
    allowed: dict[str, str] = {}
    if rule in RULES:
        for p in RULES[rule].params:
            allowed[p.flag] = p.name
    given = {name: value for name, value in options.items() if value is not None}
    stray = sorted(set(given) - set(allowed))
    if stray:
        flags = ", ".join("--" + s.replace("_", "-") for s in stray)
        raise ValueError(f"{flags}: not a parameter of rule {rule!r}")
    return {allowed[name]: value for name, value in given.items()}
