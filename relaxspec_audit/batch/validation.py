"""Batch config: the schema, and its validation (every field, before any work) into a plan.

A config is read with line numbers, validated as a whole (tasks, rules, rule parameters,
every RunConfig field, model paths, notebook parameters) and expanded into one
:class:`~relaxspec_audit.batch.plan.TaskPlan` per task: its runs (rule grids × splits) and
its notebook parameters.

Config schema (version 1), see ``relaxspec_audit/configs/demo.yaml`` for an example::

    batch: demo                  # name: reports go to <out>/<batch>/
    engine: local                # or ray: shards on a Ray cluster (docs/SCALING.md)
    defaults: {k: 4, limit: 8}   # RunConfig fields shared by every run
    notebooks: [fidelity, ...]   # which notebooks to render per task (default: all but collect)
    parameters: {ni_margin: 0.05}  # notebook parameters shared by every task
    tasks:
      - task: arith              # registry name or a JSONL path
        splits: [discovery, confirmation]
        parameters: {...}        # per-task notebook parameters
        rules:
          - rule: nucleus
            theta: [0.8, 0.9]    # a list is a grid: one run per value
            temperature: 1.0     # any RunConfig field can be set per rule or per task
            samples_per_item: 4  # completions per item (T > 0; greedy rules get 1, warned)
        coupling: {seed: 1, limit: 20}   # extra runs: what the shared stream buys
        noise_floor: {batch_size: 1, limit: 20}  # or {dtype: float32, limit: 20}
        timing: {items: 16, repeats: 6}  # the paired wall-clock pass (off when absent)
        min_gain: 1.0            # least modelled speed-up (lower bound) that PASS needs

The last four are plan keys (``batch.plan`` says what each adds); they may also be set
under ``defaults``.

Errors name the field by its path in the config, e.g.
``demo.yaml:14: tasks[1].rules[2].theta: must be in (0, 1], got 1.5``.

The file is read by ``batch.loading`` (size, UTF-8, alias and duplicate-key limits, the
line of every key). Notebook parameters are checked for type and range by
``batch.validate_parameters``, the checker the notebooks' validation cells call; model
paths by ``pairs.lookup.resolve_model``.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxspec_audit.batch.loading import BatchConfigError, line_of, read_yaml
from relaxspec_audit.batch.notebooks import NOTEBOOKS, notebook_parameters
from relaxspec_audit.batch.plan import (
    DEFAULT_NOTEBOOKS,
    PLAN_KEYS,
    BatchConfig,
    TaskPlan,
    coupling_runs,
    floor_runs,
    grid_points,
    min_gain,
    plan_key,
    timing,
)
from relaxspec_audit.collect.config import TARGET_ONLY, ConfigError, RunConfig
from relaxspec_audit.pairs.lookup import resolve_model
from relaxspec_audit.verify.registry import RULES

#: Version of the batch config schema (the ``schema`` key; 1 when absent).
BATCH_SCHEMA_VERSION = 1
#: Parameters the batch's own audit reads (``audit.audit_task``), whatever the notebooks.
AUDIT_TERMS = ("ni_margin", "alpha", "min_gain")
#: Notebook parameters the batch sets itself; a config may not set them.
BATCH_PARAMETERS = ("runs_dir", "task", "numbers_path")
#: Bundled configs (package data).
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

_TOP_KEYS = ("schema", "batch", "engine", "defaults", "notebooks", "parameters", "tasks")
#: Collection engines: this process (and ``--jobs`` workers), or a Ray cluster.
ENGINES = ("local", "ray")
_TASK_KEYS = ("task", "splits", "rules", "parameters")
# RunConfig fields a config sets per task/rule; task, split, rule and params are structural,
# and variant is set by the plan for its extra runs (coupling, noise floor).
_RUN_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(RunConfig)
    if f.name not in ("task", "split", "rule", "params", "variant")
)
_MODEL_FIELDS = ("target", "draft")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def bundled_config(name: str) -> Path:
    """Path of a bundled config (``relaxspec_audit/configs/<name>.yaml``)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no bundled config {name!r}; bundled: {', '.join(known)}")
    return path


def load_config(config: str | Path | Mapping[str, Any]) -> BatchConfig:
    """Read and validate a batch config (a YAML path or an already parsed mapping).

    Everything is checked before any work: task names, rule names, rule parameters
    (through ``rules.make_params``), every RunConfig field (``RunConfig.validate``), model
    paths, and notebook parameters (against the notebooks' ``parameters`` cells).

    Args:
        config: path to a YAML file, or a mapping with the same structure.

    Returns:
        The validated :class:`BatchConfig`.

    Raises:
        BatchConfigError: naming the file, line and field path of the first problem.
    """
    source: str | None = None
    path: Path | None = None
    if isinstance(config, str | Path):
        path = Path(config)
        source = str(path)
        if not path.is_file():
            raise BatchConfigError("<file>", f"no such config file: {source}")
        data = read_yaml(path)
    else:
        data = config
    return ConfigValidator(source).batch(data, path)


class ConfigValidator:
    """Walks a parsed config, building plans and raising errors with file:line: path.

    ``batch.plan`` checks and expands the plan keys through :meth:`fail`, :meth:`mapping`
    and :meth:`sub_int`.
    """

    def __init__(self, source: str | None):
        self.source = source

    def fail(self, path: str, message: str, container: Any = None, key: Any = None) -> None:
        """Raise the :class:`BatchConfigError` of field ``path`` at the line of ``key``."""
        raise BatchConfigError(path, message, source=self.source, line=line_of(container, key))

    def mapping(
        self, value: Any, path: str, parent: Any, key: Any, allowed: Sequence[str]
    ) -> Mapping:
        """``value`` as a mapping whose keys are all ``allowed`` (else fail naming the key)."""
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping, got {type(value).__name__}", parent, key)
        for name in value:
            if name not in allowed:
                self.fail(
                    f"{path}.{name}" if path else str(name),
                    f"unknown key (known: {', '.join(allowed)})",
                    value,
                    name,
                )
        return value

    def batch(self, data: Any, path: Path | None) -> BatchConfig:
        """The whole config: top-level keys, every task, then the notebook parameters."""
        top = self.mapping(data, "", None, None, _TOP_KEYS)
        schema = top.get("schema", BATCH_SCHEMA_VERSION)
        if schema != BATCH_SCHEMA_VERSION:
            self.fail(
                "schema",
                f"unsupported version {schema!r} (this is {BATCH_SCHEMA_VERSION})",
                top,
                "schema",
            )
        name = top.get("batch")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            self.fail(
                "batch",
                f"must be a name of letters, digits, '_', '.', '-', got {name!r}",
                top,
                "batch",
            )
        engine = top.get("engine", "local")
        if engine not in ENGINES:
            self.fail("engine", f"must be one of {list(ENGINES)}, got {engine!r}", top, "engine")
        defaults = top.get("defaults", {}) or {}
        self.mapping(defaults, "defaults", top, "defaults", (*_RUN_FIELDS, *PLAN_KEYS))
        notebooks = self.notebooks(top)
        shared = self.parameters(top.get("parameters", {}) or {}, "parameters", top, "parameters")
        tasks = top.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            self.fail("tasks", "must be a non-empty list of task entries", top, "tasks")
        known_tasks = _known_tasks()
        plans: list[TaskPlan] = []
        for i, entry in enumerate(tasks):
            plans.append(self.task(entry, f"tasks[{i}]", tasks, i, defaults, known_tasks, shared))
        seen: set[str] = set()
        for i, plan in enumerate(plans):
            if plan.slug in seen:
                self.fail(f"tasks[{i}].task", f"task {plan.task!r} appears twice", tasks[i], "task")
            seen.add(plan.slug)
        self.notebook_parameters(plans, notebooks, top, tasks)
        return BatchConfig(
            name=name, tasks=tuple(plans), notebooks=notebooks, source=path, engine=engine
        )

    def notebooks(self, top: Mapping) -> tuple[str, ...]:
        """The notebooks to render, known ones only, in report order."""
        value = top.get("notebooks", list(DEFAULT_NOTEBOOKS))
        # [] is a batch of summaries, the index and the explorer pages, with no notebook.
        if not isinstance(value, list):
            self.fail("notebooks", f"must be a list of notebook names, got {value!r}", top,
                      "notebooks")  # fmt: skip
        for j, nb in enumerate(value):
            if nb not in NOTEBOOKS:
                self.fail(
                    f"notebooks[{j}]",
                    f"unknown notebook {nb!r} (known: {', '.join(NOTEBOOKS)})",
                    value,
                    j,
                )
        return tuple(nb for nb in NOTEBOOKS if nb in value)

    def parameters(self, value: Any, path: str, parent: Any, key: Any) -> dict[str, Any]:
        """A notebook-parameters block; the batch's own parameters may not be set."""
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping, got {type(value).__name__}", parent, key)
        for name in value:
            if name in BATCH_PARAMETERS:
                self.fail(
                    f"{path}.{name}", "is set by the batch runner, not the config", value, name
                )
        return dict(value)

    def task(
        self,
        entry: Any,
        path: str,
        parent: Any,
        index: int,
        defaults: Mapping,
        known_tasks: set[str] | None,
        shared: dict[str, Any],
    ) -> TaskPlan:
        """One task entry: its rules' runs on its splits, its plan keys and parameters."""
        entry = self.mapping(entry, path, parent, index, (*_TASK_KEYS, *_RUN_FIELDS, *PLAN_KEYS))
        task = entry.get("task")
        if not isinstance(task, str) or not task:
            self.fail(
                f"{path}.task", f"must be a task name or JSONL path, got {task!r}", entry, "task"
            )
        if task.endswith(".jsonl"):
            if not Path(task).is_file():
                self.fail(f"{path}.task", f"no such JSONL file: {task}", entry, "task")
        elif known_tasks is not None and task not in known_tasks:
            self.fail(
                f"{path}.task",
                f"unknown task {task!r} (known: {', '.join(sorted(known_tasks))})",
                entry,
                "task",
            )
        splits = entry.get("splits", ["discovery", "confirmation"])
        if not isinstance(splits, list) or not splits:
            self.fail(
                f"{path}.splits", f"must be a non-empty list, got {splits!r}", entry, "splits"
            )
        rules_ = entry.get("rules")
        if not isinstance(rules_, list) or not rules_:
            self.fail(f"{path}.rules", "must be a non-empty list of rule entries", entry, "rules")
        # Where each run field was set, so an error points at the right line.
        origin = {k: ("defaults", defaults) for k in defaults if k in _RUN_FIELDS}
        origin.update({k: (path, entry) for k in entry if k in _RUN_FIELDS})
        base = {k: defaults[k] for k in defaults if k in _RUN_FIELDS}
        base |= {k: entry[k] for k in entry if k in _RUN_FIELDS}
        runs: dict[str, RunConfig] = {}
        for j, rule_entry in enumerate(rules_):
            for run in self.rule(
                rule_entry, f"{path}.rules[{j}]", rules_, j, task, splits, entry, base, origin
            ):
                runs.setdefault(run.to_json(), run)
        params = shared | self.parameters(
            entry.get("parameters", {}) or {}, f"{path}.parameters", entry, "parameters"
        )
        main = tuple(runs.values())
        keys = {k: plan_key(k, path, entry, defaults) for k in PLAN_KEYS}
        return TaskPlan(
            task=task,
            runs=main,
            parameters=params,
            coupling_runs=coupling_runs(self, main, splits, *keys["coupling"]),
            floor_runs=floor_runs(self, main, *keys["noise_floor"]),
            timing=timing(self, *keys["timing"]),
            min_gain=min_gain(self, *keys["min_gain"]),
        )

    def sub_int(self, block: Mapping, name: str, path: str, default: int, minimum: int) -> int:
        """An integer field of a plan-key mapping (``coupling.limit``, ``timing.items``)."""
        value = block.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(
                f"{path}.{name}", f"must be an integer >= {minimum}, got {value!r}", block, name
            )
        return value

    def rule(
        self,
        entry: Any,
        path: str,
        parent: Any,
        index: int,
        task: str,
        splits: list,
        task_entry: Mapping,
        base: dict[str, Any],
        origin: dict[str, tuple[str, Any]],
    ) -> list[RunConfig]:
        """One rule entry: a validated run per point of its grid and per split."""
        if isinstance(entry, str):  # `- exact` is short for `- rule: exact`
            entry = {"rule": entry}
        if not isinstance(entry, Mapping) or "rule" not in entry:
            self.fail(
                path, f"must be a rule name or a mapping with 'rule', got {entry!r}", parent, index
            )
        rule = entry["rule"]
        param_names = _rule_param_names(rule)
        if param_names is None:
            self.fail(
                f"{path}.rule",
                f"unknown rule {rule!r} (known: {', '.join(_known_rules())})",
                entry,
                "rule",
            )
        allowed = ("rule", *param_names, *_RUN_FIELDS)
        self.mapping(entry, path, parent, index, allowed)
        fields = dict(base)
        where = dict(origin)
        for k in entry:
            if k in _RUN_FIELDS:
                fields[k] = entry[k]
                where[k] = (path, entry)
        if rule in _greedy_only_rules() and "temperature" not in entry:
            # Greedy-only rules (THEORY §2.2, §2.4) run at temperature 0 unless told otherwise,
            # so one config can hold the sampling and the greedy families side by side.
            fields["temperature"] = 0.0
        self.greedy_samples(rule, fields, where, path)
        grid = {k: entry[k] for k in param_names if k in entry}
        for k, v in grid.items():
            if isinstance(v, list) and not v:
                self.fail(f"{path}.{k}", "an empty list gives no runs", entry, k)
        runs: list[RunConfig] = []
        for combo in grid_points(grid):
            # Resolved once per grid point, not once per split.
            params = self.rule_params(rule, {k: x for k, _, x in combo}, combo, path, entry)
            for s, split in enumerate(splits):
                try:
                    config = RunConfig(
                        task=task, split=split, rule=rule, params=params, **fields
                    ).validate()
                except ConfigError as exc:
                    if exc.field == "split":
                        self.fail(
                            f"{path.rsplit('.rules', 1)[0]}.splits[{s}]",
                            exc.message,
                            task_entry.get("splits"),
                            s,
                        )
                    where_path, container = where.get(exc.field, (path, entry))
                    self.fail(f"{where_path}.{exc.field}", exc.message, container, exc.field)
                runs.append(self.model_paths(config, where))
        return runs

    def greedy_samples(
        self, rule: Any, fields: dict[str, Any], where: dict[str, tuple[str, Any]], path: str
    ) -> None:
        """Greedy decoding gets one sample per item, with a warning (not an error).

        At temperature 0 every sample of an item is the same output; refusing would let a
        ``samples_per_item`` under ``defaults`` break every greedy rule of the config.
        """
        n, temperature = fields.get("samples_per_item"), fields.get("temperature", 1.0)
        greedy = temperature == 0 and not isinstance(temperature, bool)
        if not (greedy and isinstance(n, int) and not isinstance(n, bool) and n > 1):
            return
        set_at, container = where.get("samples_per_item", (path, None))
        line = line_of(container, "samples_per_item") if container is not None else None
        warnings.warn(
            f"{self.source or 'config'}:{line or '?'}: {set_at}.samples_per_item: rule "
            f"{rule!r} at {path} decodes at temperature 0 (greedy), where the {n} samples "
            "would be identical; it gets 1 sample per item",
            UserWarning,
            stacklevel=2,
        )
        fields["samples_per_item"] = 1

    def rule_params(self, rule: str, params: dict, combo: tuple, path: str, entry: Mapping) -> Any:
        """The rule's resolved params (None for target-only); errors name field and line."""
        if rule == TARGET_ONLY:
            return None
        from relaxspec_audit.verify.registry import resolve_params

        try:
            return resolve_params(rule, params)
        except (TypeError, ValueError) as exc:
            message = str(exc)
            for k, i, _ in combo:
                if message.startswith(f"{k}:"):
                    at = f"{path}.{k}" + (f"[{i}]" if i is not None else "")
                    line = line_of(entry[k], i) if i is not None else line_of(entry, k)
                    raise BatchConfigError(
                        at, message[len(k) + 1 :].strip(), source=self.source, line=line
                    ) from exc
            self.fail(path, message, entry, "rule")

    def model_paths(self, config: RunConfig, where: dict[str, tuple[str, Any]]) -> RunConfig:
        """``config`` with its models resolved (``pairs.lookup``); fail where one is absent."""
        resolved = {}
        for name in _MODEL_FIELDS:
            value = getattr(config, name)
            found = resolve_model(value)
            if found is None:
                where_path, container = where.get(name, ("defaults", None))
                self.fail(
                    f"{where_path}.{name}",
                    f"model path not found: {value!r} (a folder with config.json, relative to "
                    f"the working directory or the repository; the embedded pair is built by "
                    f"`make models`)",
                    container,
                    name,
                )
            resolved[name] = found
        return dataclasses.replace(config, **resolved)

    def notebook_parameters(
        self, plans: list[TaskPlan], notebooks: tuple[str, ...], top: Mapping, tasks: list
    ) -> None:
        """Every notebook parameter is declared by a rendered notebook and valid."""
        declared = {nb: notebook_parameters(nb) for nb in notebooks}
        known = sorted(set().union(*declared.values()) - set(BATCH_PARAMETERS))
        for i, plan in enumerate(plans):
            for name in plan.parameters:
                # The batch's own audit (summary.json) reads its terms, notebooks or not.
                if name not in AUDIT_TERMS and not any(name in d for d in declared.values()):
                    own = tasks[i].get("parameters") or {}
                    key = _written(own, name)
                    if key is not None:
                        path, container = f"tasks[{i}].parameters.{key}", own
                    else:
                        container = top.get("parameters") or {}
                        key = _written(container, name) or name
                        path = f"parameters.{key}"
                    self.fail(
                        path,
                        f"unknown notebook parameter (notebooks {', '.join(notebooks)} "
                        f"declare: {', '.join(known)})",
                        container,
                        key,
                    )
        self.parameter_values(top, tasks)

    def parameter_values(self, top: Mapping, tasks: list) -> None:
        """Check each notebook parameter's type and range where it is written.

        The notebooks' validation cells would refuse the same values, but only after every
        run was collected; here they stop the batch before any work.
        """
        from relaxspec_audit.batch.parameters import validate_parameters

        blocks = [("parameters", top.get("parameters") or {})]
        for i, entry in enumerate(tasks):
            blocks.append((f"tasks[{i}].parameters", entry.get("parameters") or {}))
        for path, block in blocks:
            for key, value in block.items():
                try:
                    validate_parameters(**{key: value})
                except ValueError as exc:
                    message = str(exc).removeprefix(f"{key}: ")
                    self.fail(f"{path}.{key}", message, block, key)


def _written(parameters: Mapping, name: str) -> str | None:
    """``name`` when a ``parameters`` block sets it, else None."""
    return name if name in parameters else None


def _known_tasks() -> set[str] | None:
    try:
        from relaxspec_audit import tasks
    except ImportError:  # pragma: no cover (tasks.py is part of the package)
        return None
    names = set()
    for item in tasks.list_tasks():
        if isinstance(item, Mapping):
            names.add(str(item["name"]))
        else:
            names.add(item if isinstance(item, str) else getattr(item, "name", str(item)))
    return names


def _known_rules() -> list[str]:
    return sorted([*RULES, TARGET_ONLY])


def _greedy_only_rules() -> set[str]:
    return {name for name, spec in RULES.items() if spec.greedy_only}


def _rule_param_names(rule: Any) -> tuple[str, ...] | None:
    """Keys a rule entry may set: the rule's parameters."""
    if rule == TARGET_ONLY:
        return ()
    if not isinstance(rule, str) or rule not in RULES:
        return None
    return RULES[rule].param_names


def plan_task(
    task: str,
    rules: Sequence[Any],
    *,
    splits: Sequence[str] = ("discovery", "confirmation"),
    **defaults: Any,
) -> TaskPlan:
    """Plan the runs of one task from rule entries, validated as in a batch config.

    Args:
        task: task name or JSONL path.
        rules: rule entries (``"exact"`` or ``{"rule": "nucleus", "theta": [0.8, 0.9]}``).
        splits: splits to decode.
        **defaults: RunConfig fields shared by every run (``limit``, ``k``, ...).

    Returns:
        The task's :class:`TaskPlan`.

    Raises:
        BatchConfigError: naming the bad field, as for a config file.
    """
    data = {
        "batch": "plan",
        "defaults": dict(defaults),
        "notebooks": ["collect"],
        "tasks": [{"task": task, "splits": list(splits), "rules": list(rules)}],
    }
    return load_config(data).tasks[0]
