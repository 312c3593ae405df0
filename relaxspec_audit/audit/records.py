"""The records a verdict is made of: the base record, a setting's audit row, the verdict.

The typed building blocks of :mod:`relaxspec_audit.audit.results` (``summary.json``):
:class:`Record` (frozen, validated, non-finite floats stored as ``null``), the audit row
of one setting (:class:`SettingRow`), the frontier and the verdict of
:func:`~relaxspec_audit.audit.select.recommend` (:class:`FrontierRow`, :class:`Verdict`),
and the evidence blocks beside a verdict (speed, noise floor, attribution, likelihood,
coupling). A rule parameter that is infinite (an uncapped ASD ``cap``) is written as the
string ``"inf"`` and read back as ``math.inf``.

Field order is the JSON key order: do not rename, retype or remove a field without
bumping ``results.SUMMARY_SCHEMA_VERSION``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
    model_validator,
)

Status = Literal["PASS", "NO-GAIN", "FAIL", "INCONCLUSIVE"]
#: A setting's parameters as data: ``{"theta": 0.9}``, ``{"budget": 8.0, "gate": 0.25, …}``.
Params = dict[str, float | int | str]


def plain(value: Any) -> Any:
    """JSON values: numpy scalars → Python, non-finite floats → None, tuples → lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _params_out(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if params is None:
        return None
    return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in params.items()}


def _params_in(params: Any) -> Any:
    if not isinstance(params, Mapping):
        return params
    return {k: (math.inf if v == "inf" else v) for k, v in params.items()}


class Record(BaseModel):
    """A frozen, validated record; non-finite floats become None before validation."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    #: Optional fields left out of the JSON when unset (a key a reader tests for).
    _omit_none: ClassVar[tuple[str, ...]] = ()
    #: Fields holding a setting's parameters: an infinite one stays infinite (``"inf"``).
    _params_fields: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        keep = {k: _params_in(data[k]) for k in cls._params_fields if k in data}
        return {**plain({k: v for k, v in data.items() if k not in keep}), **keep}

    @model_serializer(mode="wrap")
    def _omit(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        for name in self._omit_none:
            if out.get(name) is None:
                out.pop(name, None)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values (the form ``summary.json`` holds)."""
        return self.model_dump(mode="json", by_alias=True)


class Failed(Record):
    """An evidence block that could not be computed; the verdict stands without it."""

    error: str
    sentence: None = None


# ------------------------------------------------------------------------ one setting, one row


class SettingRow(Record):
    """One run of a task audited against its paired reference (``audit.table``'s row).

    Speed-ups named ``speedup_*`` are modelled (pass counts × the cost table); ``wall_*``
    are the collection's own wall clock (load-dependent, for reference only).
    """

    rule: str
    reference: str
    knob: str | None
    value: float | None
    setting: str
    split: str | None
    is_reference: bool
    n_requests: int | None
    tau: float | None
    tau_reference: float | None
    speedup_vs_reference: float | None
    speedup_ci_low: float | None
    speedup_ci_high: float | None
    speed_basis: str | None
    speed_note: str | None
    wall_speedup_vs_reference: float | None
    wall_ci_low: float | None
    wall_ci_high: float | None
    speedup_vs_baseline: float | None
    baseline_ci_low: float | None
    baseline_ci_high: float | None
    wall_speedup_vs_baseline: float | None
    accuracy_delta: float | None
    delta_ci_low: float | None
    delta_ci_high: float | None
    delta_ni_low: float | None
    p_noninferiority: float | None
    noninferior: bool | None
    score: float | None
    divergence: float | None
    divergence_ci_low: float | None
    divergence_ci_high: float | None
    first_pos_median: float | None
    eps_mean: float | None
    bound: float | None
    identical_rate: float | None
    identical_ci_low: float | None
    identical_ci_high: float | None
    params: str  # the resolved parameters as canonical JSON (``registry.params_dict``)


class FrontierRow(Record):
    """One setting on the frontier of :func:`~relaxspec_audit.audit.select.frontier`.

    ``setting`` holds the setting's parameter columns; in JSON they come first, flat
    (``{"theta": 0.9, "n_items": …}``), as the frontier frame has them.
    """

    setting: Params
    n_items: int | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    ni_low: float | None
    p_noninf: float | None
    noninferior: bool
    sd_diff: float | None
    binary: bool | None
    n10: int | None
    n01: int | None
    speedup: float | None
    speedup_ci_low: float | None
    speedup_ci_high: float | None
    speed_basis: str | None
    speed_note: str | None
    wall_speedup: float | None
    wall_ci_low: float | None
    wall_ci_high: float | None
    tau: float | None
    pareto: bool | None = None
    eps: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        # The parameter columns first (an infinite cap stays infinite), then plain numbers.
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        setting = data.pop("setting", None)
        if setting is None:
            fields = set(cls.model_fields)
            setting = {k: data.pop(k) for k in list(data) if k not in fields}
        return {**plain(data), "setting": _params_in(setting)}

    @model_serializer(mode="wrap")
    def _omit(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Flat in JSON: the parameter columns, then the statistics (ε only when capped).
        out = handler(self)
        if out.get("eps") is None:
            out.pop("eps", None)
        return {**_params_out(out.pop("setting")), **out}


class Plan(Record):
    """How the confirmation split was sized (``power.plan_items``).

    The test, what it was planned at, and the power achieved at the size asked for.
    """

    test: str
    planning_value: float | None
    note: str
    planning_effect: float | None = None
    target_power: float | None = None
    power_achieved: float | None = None
    power_method: str | None = None


class VerdictNumbers(Record):
    """The numbers behind a verdict: its terms, the discovery frontier, the confirmation."""

    ni_margin: float
    alpha: float
    power: float
    min_gain: float
    eps_cap: float | None
    discovery: list[FrontierRow] = []
    planning: Plan | None = None
    confirmation: FrontierRow | None = None


class Verdict(Record):
    """The sign-off of one relaxed setting family (THEORY §3, ``select.recommend``).

    Attributes:
        status: ``PASS`` (non-inferior at δ on confirmation with enough items, and the
            modelled speed-up's lower bound above ``min_gain``), ``NO-GAIN`` (non-inferior
            but not shown faster), ``FAIL`` (shown inferior, over the ε cap, or not
            non-inferior with an adequately powered confirmation) or ``INCONCLUSIVE``
            (too few items; ``n_required`` says how many).
        setting: the chosen setting's parameters (None: nothing chosen).
        reasons: plain-language reasons in the order they were established; they name a
            setting by its label (``θ = 0.9``), never as a Python value.
        numbers: the numbers behind the decision.
        n_required: items per split the confirmation test needs (when computed).
    """

    _params_fields = ("setting",)
    status: Status
    setting: Params | None
    reasons: list[str]
    numbers: VerdictNumbers
    n_required: int | None = None

    @field_serializer("setting")
    def _setting_out(self, value: Params | None) -> Any:
        return _params_out(value)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent)


# ------------------------------------------------------------------------ evidence beside it


class Interval(Record):
    """A speed-up with its interval (None: not estimable)."""

    speedup: float | None
    ci_low: float | None
    ci_high: float | None


class Modelled(Interval):
    """The modelled speed-up over the reference: pass counts × the cost table."""

    basis: str | None
    note: str | None


class WallClock(Interval):
    """A wall-clock speed-up, labelled with how it was measured."""

    label: str
    kind: str


class SpeedFacts(Record):
    """What a sign-off says about speed: modelled first, the wall clock labelled."""

    modelled: Modelled
    vs_target: Interval | None
    reference_vs_target: Interval | None
    wall_clock: WallClock | None
    sentence: str
    split: str | None = None


class GreedyFloor(Record):
    """Strict greedy speculation against target-only decoding at T = 0 (lossless)."""

    n: int
    n_diverged: int
    rate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    first_pos_mean: float | None = None
    first_pos_median: float | None = None
    first_positions: list[int] = []
    acc_delta: float | None = None
    acc_ci_low: float | None = None
    acc_ci_high: float | None = None
    sentence: str


class NumericFloor(Record):
    """The reference decoded twice, one thing changed (batch size, dtype)."""

    variant: str
    n: int
    n_diverged: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    first_positions: list[int] = []
    n_aligned: int
    n_token_diffs: int
    n_flips: int
    max_abs_dp: float | None
    max_abs_dlogp: float | None
    differences: dict[str, list[Any]]  # "config.batch_size": [this run's, the replica's]
    sentence: str


class NoiseFloor(Record):
    """How far the lossless decoder departs from itself: what divergence is read against."""

    greedy: GreedyFloor | None
    numeric: list[NumericFloor]
    sentence: str
    short: str | None


class Attribution(Record):
    """Where and why the relaxed outputs first left the reference's: the rule or numerics."""

    n_pairs: int
    n_diverged: int
    counts: dict[str, int]
    share_rule: float | None
    ci_low: float | None
    ci_high: float | None
    causes: dict[str, int]
    sentence: str


class Loglik(Record):
    """Paired emitted-token log-likelihood under the target, relaxed − reference (nats)."""

    available: bool
    n_items: int
    n_pairs: int
    loglik_ref: float | None
    loglik_rel: float | None
    delta: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    sentence: str


class Coupling(Record):
    """What the shared random stream bought: items needed, coupled vs independent seeds."""

    n_items: int
    n_pairs: int
    binary: bool
    test: str
    measure: str
    coupled: float | None
    independent: float | None
    coupled_plan: float | None
    independent_plan: float | None
    items_coupled: int | None
    items_independent: int | None
    items_ratio: float | None
    measure_ratio: float | None
    measure_ratio_ci_low: float | None
    measure_ratio_ci_high: float | None
    divergence_coupled: float | None
    divergence_independent: float | None
    temperature: float | None
    note: str | None
    sentence: str
