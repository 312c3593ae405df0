"""The plan of a batch: its typed objects, and the task keys that add runs and checks.

A validated config (``batch.validation``) is a :class:`BatchConfig`: one
:class:`TaskPlan` per task, holding its main runs (rule grids × splits, see
:func:`grid_points`) and what the plan keys add. The plan keys may be set per task or
under ``defaults`` (a task's own value replaces the defaults' whole; ``null`` turns an
inherited one off):

- ``coupling`` (``seed``: default each run's seed + 1; ``limit``: default 20): every
  relaxed setting at temperature > 0 is run again at that seed, on the discovery split,
  on ``limit`` items (at most the run's own limit), with ``variant="coupling"``
  (``TaskPlan.coupling_runs``), to be paired with the main reference on its own seed
  (``audit.coupling.coupling_gain``). Replicas never get more items than their run.
- ``noise_floor`` (exactly one of ``batch_size`` or ``dtype``; ``limit`` default 20):
  every reference (lossless) run again on the discovery split at that batch size or
  dtype, ``variant="floor-b<batch_size>"`` or ``"floor-<dtype>"`` (``TaskPlan.floor_runs``).
- ``timing`` (``items`` ≥ 1, default 16; ``repeats`` ≥ 2, default 6): stored as
  ``TaskPlan.timing``, None when absent.
- ``min_gain`` (a number ≥ 0, default 1.0): ``TaskPlan.min_gain``.

Each key's block is checked here, where it is expanded, through the validator's
``fail``/``mapping``/``sub_int``, so its errors name the file, line and field like every
other.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaxspec_audit.audit.select import DEFAULT_MIN_GAIN
from relaxspec_audit.collect.config import DTYPES, RunConfig, task_slug
from relaxspec_audit.verify.registry import RULES

if TYPE_CHECKING:
    from relaxspec_audit.batch.validation import ConfigValidator

#: Rendered per task when the config does not say.
DEFAULT_NOTEBOOKS = ("rejection_anatomy", "fidelity", "choose_setting", "signoff")
#: Task keys that may also be given under ``defaults``: the plan's extra runs and checks.
PLAN_KEYS = ("coupling", "noise_floor", "timing", "min_gain")
#: Defaults of the plan keys' own fields.
COUPLING_LIMIT = 20
FLOOR_LIMIT = 20
TIMING_DEFAULTS = {"items": 16, "repeats": 6}


@dataclass(frozen=True)
class TaskPlan:
    """One task of a batch: its runs and the notebook parameters for its reports.

    Attributes:
        task: task name (or JSONL path) as written in the config.
        runs: the main runs (rule grids × splits), validated; what the reports pair.
        parameters: notebook parameters (config-wide merged with the task's own).
        coupling_runs: the ``coupling`` replicas: each T > 0 relaxed setting at another
            seed, discovery split, ``variant="coupling"`` (empty when off).
        floor_runs: the ``noise_floor`` replicas of the reference runs, discovery split,
            ``variant="floor-…"`` (empty when off).
        timing: ``{"items": int, "repeats": int}`` of the paired wall-clock pass, or None.
        min_gain: the least modelled speed-up (its lower confidence bound) PASS needs.
    """

    task: str
    runs: tuple[RunConfig, ...]
    parameters: dict[str, Any] = field(default_factory=dict)
    coupling_runs: tuple[RunConfig, ...] = ()
    floor_runs: tuple[RunConfig, ...] = ()
    timing: dict[str, int] | None = None
    min_gain: float = DEFAULT_MIN_GAIN

    def all_runs(self) -> list[RunConfig]:
        """The main runs, then the coupling and noise-floor replicas, each once."""
        seen: dict[str, RunConfig] = {}
        for run in (*self.runs, *self.coupling_runs, *self.floor_runs):
            seen.setdefault(run.to_json(), run)
        return list(seen.values())

    @property
    def slug(self) -> str:
        """Folder name of the task under ``reports/<batch>/``."""
        return task_slug(self.task)


@dataclass(frozen=True)
class BatchConfig:
    """A validated batch config.

    Attributes:
        name: batch name; reports go to ``<out>/<name>/``.
        tasks: one plan per task, in config order.
        notebooks: notebook names rendered per task, in report order.
        source: the YAML file it came from (None for a dict).
        engine: where runs are collected: ``"local"`` or ``"ray"`` (``batch.ray_engine``);
            the command line's ``--engine`` overrides it.
    """

    name: str
    tasks: tuple[TaskPlan, ...]
    notebooks: tuple[str, ...] = DEFAULT_NOTEBOOKS
    source: Path | None = None
    engine: str = "local"

    def all_runs(self) -> list[RunConfig]:
        """Every distinct run of the batch (a run shared by two tasks is collected once)."""
        seen: dict[str, RunConfig] = {}
        for plan in self.tasks:
            for run in plan.all_runs():
                seen.setdefault(run.to_json(), run)
        return list(seen.values())


def grid_points(grid: Mapping[str, Any]) -> Iterator[tuple[tuple[str, int | None, Any], ...]]:
    """Every point of a rule entry's parameter grid: a list value is an axis, one run per value.

    Args:
        grid: the rule entry's parameters, ``{name: value or list of values}``.

    Yields:
        One ``((name, index in its list or None, value), ...)`` per point, in the order
        of the entry's keys and values (the index lets an error name ``theta[2]``).
    """
    axes = [
        [(k, i, x) for i, x in enumerate(v)] if isinstance(v, list) else [(k, None, v)]
        for k, v in grid.items()
    ]
    yield from itertools.product(*axes)


def plan_key(key: str, path: str, entry: Mapping, defaults: Mapping) -> tuple[Any, str, Mapping]:
    """A plan key's value and where it was written: the task's own, else the defaults'."""
    if key in entry:
        return entry[key], f"{path}.{key}", entry
    return defaults.get(key), f"defaults.{key}", defaults


def coupled(run: RunConfig) -> bool:
    """Whether ``coupling`` replicates ``run``: a relaxed rule that draws uniforms (T > 0).

    Target-only decoding, the references and greedy decoding read no uniform, so another
    seed changes nothing for them.
    """
    spec = RULES.get(run.rule)
    return spec is not None and not spec.lossless and not run.greedy


def coupling_runs(
    check: ConfigValidator,
    runs: tuple[RunConfig, ...],
    splits: list,
    value: Any,
    path: str,
    container: Mapping,
) -> tuple[RunConfig, ...]:
    """Each T > 0 relaxed setting again at another seed (the ``coupling`` key)."""
    if value is None:
        return ()
    key = path.rsplit(".", 1)[-1]
    block = check.mapping(value, path, container, key, ("seed", "limit"))
    limit = check.sub_int(block, "limit", path, COUPLING_LIMIT, 1)
    seed = block.get("seed")
    if seed is not None:
        check.sub_int(block, "seed", path, 0, 0)
    if "discovery" not in splits:
        check.fail(
            path,
            "needs the discovery split (the coupled pair is the main reference run on "
            f"discovery), but splits are {list(splits)}",
            container,
            key,
        )
    out: dict[str, RunConfig] = {}
    for run in runs:
        if not coupled(run):
            continue
        other = run.seed + 1 if seed is None else seed
        if other == run.seed:
            check.fail(
                f"{path}.seed",
                f"must differ from the seed of the runs it replicates ({run.seed})",
                block,
                "seed",
            )
        replica = dataclasses.replace(
            run, split="discovery", limit=_at_most(limit, run.limit), seed=other,
            variant="coupling",
        )  # fmt: skip
        out.setdefault(replica.to_json(), replica.validate())
    return tuple(out.values())


def floor_runs(
    check: ConfigValidator,
    runs: tuple[RunConfig, ...],
    value: Any,
    path: str,
    container: Mapping,
) -> tuple[RunConfig, ...]:
    """Each reference run again at another batch size or dtype (``noise_floor``)."""
    if value is None:
        return ()
    key = path.rsplit(".", 1)[-1]
    block = check.mapping(value, path, container, key, ("batch_size", "dtype", "limit"))
    if ("batch_size" in block) == ("dtype" in block):
        check.fail(path, "give exactly one of batch_size or dtype", container, key)
    limit = check.sub_int(block, "limit", path, FLOOR_LIMIT, 1)
    if "batch_size" in block:
        b = check.sub_int(block, "batch_size", path, 1, 1)
        change: dict[str, Any] = {"batch_size": b, "variant": f"floor-b{b}"}
    else:
        dtype = block["dtype"]
        choices = [d for d in DTYPES if d != "auto"]
        if dtype not in choices:
            check.fail(
                f"{path}.dtype",
                f"must be one of {', '.join(choices)}, got {dtype!r}",
                block,
                "dtype",
            )
        change = {"dtype": dtype, "variant": f"floor-{dtype}"}
    out: dict[str, RunConfig] = {}
    for run in runs:
        spec = RULES.get(run.rule)
        if spec is None or not spec.lossless:
            continue
        replica = dataclasses.replace(
            run, split="discovery", limit=_at_most(limit, run.limit), **change
        )
        out.setdefault(replica.to_json(), replica.validate())
    return tuple(out.values())


def timing(
    check: ConfigValidator, value: Any, path: str, container: Mapping
) -> dict[str, int] | None:
    """The paired wall-clock pass: ``{items, repeats}``, None when off."""
    if value is None:
        return None
    block = check.mapping(value, path, container, path.rsplit(".", 1)[-1], tuple(TIMING_DEFAULTS))
    return {
        "items": check.sub_int(block, "items", path, TIMING_DEFAULTS["items"], 1),
        # One repeat cannot show run-to-run noise, which the interval must include.
        "repeats": check.sub_int(block, "repeats", path, TIMING_DEFAULTS["repeats"], 2),
    }


def min_gain(check: ConfigValidator, value: Any, path: str, container: Mapping) -> float:
    """The least modelled speed-up PASS needs (a number >= 0)."""
    if value is None:
        return DEFAULT_MIN_GAIN
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        check.fail(
            path,
            f"must be a number >= 0 (a speed-up; 1.0 = as fast as the reference), got {value!r}",
            container,
            path.rsplit(".", 1)[-1],
        )
    return float(value)


def _at_most(limit: int, run_limit: int | None) -> int:
    """A replica's item limit: never more items than the run it is compared with has."""
    return limit if run_limit is None else min(limit, run_limit)
