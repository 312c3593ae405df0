"""Typed parameters of the verification rules: one frozen dataclass per rule.

Each field is declared once, with its default, its checks and its presentation (display
symbol, unit, one line of help, CLI flag) in the field's metadata
(:func:`param`). The registry (:mod:`relaxspec_audit.verify.registry`) reads them from here,
so the CLI, batch-config validation, labels and the audit's settings frame all agree.

Numpy only; importable without torch (``--help``, stats and select use it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_THETA",
    "AsdParams",
    "ExactParams",
    "FuzzyParams",
    "GreedyParams",
    "MarginParams",
    "NucleusParams",
    "ParamInfo",
    "TopkParams",
    "TypicalParams",
    "bad_thetas",
    "param",
]

#: Nucleus θ for ``in_nucleus`` of rules without a nucleus parameter (THEORY §2.3), so the
#: rejection anatomy is comparable across rules.
DEFAULT_THETA = 0.95


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """How one rule parameter is shown and given (the field's type and default are its own).

    Attributes:
        symbol: Display symbol in setting labels (``θ``, ``B``).
        unit: What the number measures (shown in help and reports).
        help: One line for ``--help`` and the docs.
        flag: CLI option name when the field name clashes with a run option (topk's
            ``top_k`` is ``--top-k-accept``; ``--top-k`` is sampling). None: the field name.
        choices: The allowed values of a string parameter (empty: any number).
    """

    symbol: str
    unit: str
    help: str
    flag: str | None = None
    choices: tuple[str, ...] = ()


def param(default: Any, symbol: str, unit: str, help: str, **info: Any) -> Any:
    """A params-dataclass field with its presentation in ``metadata["param"]``."""
    return dataclasses.field(
        default=default, metadata={"param": ParamInfo(symbol, unit, help, **info)}
    )


def bad_thetas(values: Any) -> list[Any]:
    """The values of a θ grid that are not nucleus masses in (0, 1] (NaN, ±inf, non-numbers).

    The one check of a θ grid: the run config, the ``audit`` command, the notebooks'
    parameters, the audit summary and ``es_grid`` all ask it and word their own refusal.
    """
    return [t for t in values if not (_is_real(t) and 0.0 < float(t) <= 1.0)]


def _check(ok: bool, field: str, message: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}, got {value!r}")


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _canonical_float(value: Any) -> float:
    # One spelling per value: a budget written 2 or 2.0 is one setting (and one run id).
    return float(value)


@dataclasses.dataclass(frozen=True)
class ExactParams:
    """``exact`` has no parameters (THEORY §2.1)."""


@dataclasses.dataclass(frozen=True)
class GreedyParams:
    """``greedy`` has no parameters (THEORY §2.2)."""


@dataclasses.dataclass(frozen=True)
class NucleusParams:
    """NSD parameters (THEORY §2.3).

    Attributes:
        theta: Nucleus mass θ in (0, 1].
    """

    theta: float = param(DEFAULT_THETA, "θ", "probability mass", "nucleus: nucleus mass θ")

    def __post_init__(self) -> None:
        _check(
            _is_real(self.theta) and 0.0 < self.theta <= 1.0,
            "theta",
            "must be in (0, 1]",
            self.theta,
        )
        object.__setattr__(self, "theta", _canonical_float(self.theta))


@dataclasses.dataclass(frozen=True)
class AsdParams:
    """ASD parameters (THEORY §2.4); ``math.inf`` is allowed for gate, budget and cap.

    Attributes:
        budget: Request regret budget B >= 0; 0 dispatches to strict greedy.
        gate: Local gate g >= 0 on r_i / (K − i + 1).
        cap: Per-block mismatch cap M >= 0 (int, or ``math.inf``).
    """

    budget: float = param(8.0, "B", "nats of regret per request", "asd: request regret budget B")
    gate: float = param(0.25, "g", "nats per remaining position", "asd: local gate g")
    cap: int | float = param(2, "M", "mismatches per block", "asd: per-block cap M")

    def __post_init__(self) -> None:
        _check(_is_real(self.budget) and self.budget >= 0, "budget", "must be >= 0", self.budget)
        _check(_is_real(self.gate) and self.gate >= 0, "gate", "must be >= 0", self.gate)
        _check(
            _is_real(self.cap)
            and self.cap >= 0
            and (self.cap == math.inf or self.cap == int(self.cap)),
            "cap",
            "must be an int >= 0 or math.inf",
            self.cap,
        )
        object.__setattr__(self, "budget", _canonical_float(self.budget))
        object.__setattr__(self, "gate", _canonical_float(self.gate))
        object.__setattr__(self, "cap", math.inf if self.cap == math.inf else int(self.cap))


@dataclasses.dataclass(frozen=True)
class TypicalParams:
    """Typical acceptance parameters (THEORY §2.5).

    Attributes:
        epsilon: Hard threshold ε >= 0.
        delta: Entropy-scaled threshold factor δ >= 0.
    """

    epsilon: float = param(0.09, "ε", "probability", "typical: hard threshold ε")
    delta: float = param(0.3, "δ", "factor on exp(−H(p))", "typical: entropy factor δ")

    def __post_init__(self) -> None:
        _check(
            _is_real(self.epsilon) and self.epsilon >= 0, "epsilon", "must be >= 0", self.epsilon
        )
        _check(_is_real(self.delta) and self.delta >= 0, "delta", "must be >= 0", self.delta)
        object.__setattr__(self, "epsilon", _canonical_float(self.epsilon))
        object.__setattr__(self, "delta", _canonical_float(self.delta))


DIVERGENCES = ("kl", "js", "tv")


@dataclasses.dataclass(frozen=True)
class FuzzyParams:
    """Fuzzy speculative decoding parameters (THEORY §2.5).

    Attributes:
        divergence: ``"kl"`` (KL(p‖q)), ``"js"`` (Jensen–Shannon, nats) or ``"tv"``.
        threshold: Accept the position iff D(p‖q) <= threshold (>= 0).
    """

    divergence: str = param("kl", "D", "divergence", "fuzzy: divergence D(p‖q)",
                            choices=DIVERGENCES)  # fmt: skip
    threshold: float = param(0.1, "T", "nats (TV: probability)", "fuzzy: threshold T on D")

    def __post_init__(self) -> None:
        _check(
            self.divergence in DIVERGENCES,
            "divergence",
            f"must be one of {DIVERGENCES}",
            self.divergence,
        )
        _check(
            _is_real(self.threshold) and self.threshold >= 0,
            "threshold",
            "must be >= 0",
            self.threshold,
        )
        object.__setattr__(self, "threshold", _canonical_float(self.threshold))


@dataclasses.dataclass(frozen=True)
class MarginParams:
    """Margin-aware verification parameters (THEORY §2.5).

    Attributes:
        logit_ratio: Undecided iff z₂/z₁ > logit_ratio (raw target logits; finite real).
            A logit ratio, not a nucleus mass (``theta`` is only ever a nucleus mass).
    """

    logit_ratio: float = param(0.9, "ρ", "raw-logit ratio z₂/z₁",
                               "margin: undecided when z₂/z₁ > ρ")  # fmt: skip

    def __post_init__(self) -> None:
        _check(
            _is_real(self.logit_ratio) and math.isfinite(self.logit_ratio),
            "logit_ratio",
            "must be finite",
            self.logit_ratio,
        )
        object.__setattr__(self, "logit_ratio", _canonical_float(self.logit_ratio))


@dataclasses.dataclass(frozen=True)
class TopkParams:
    """Top-k relaxed acceptance parameters (THEORY §2.5).

    Attributes:
        top_k: Draft must be within the target's top ``top_k`` (int >= 1).
        ratio: And have p(x) >= ratio · max p (ratio in [0, 1]).
    """

    top_k: int = param(10, "k", "tokens", "topk: accept drafts within the target's top k",
                       flag="top_k_accept")  # fmt: skip
    ratio: float = param(0.1, "r", "share of max p", "topk: minimum p(x) / max p")

    def __post_init__(self) -> None:
        _check(
            isinstance(self.top_k, int | np.integer)
            and not isinstance(self.top_k, bool)
            and self.top_k >= 1,
            "top_k",
            "must be an int >= 1",
            self.top_k,
        )
        _check(
            _is_real(self.ratio) and 0.0 <= self.ratio <= 1.0,
            "ratio",
            "must be in [0, 1]",
            self.ratio,
        )
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "ratio", _canonical_float(self.ratio))
