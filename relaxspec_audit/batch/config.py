"""Batch config: the YAML schema, its validation (every field, before any work) and the plan.

A config is read with line numbers, validated as a whole (tasks, rules, rule parameters,
every RunConfig field, model paths, notebook parameters) and expanded into one
:class:`TaskPlan` per task: its runs (rule grids × splits) and its notebook parameters.

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

The last four are task keys that may also be set under ``defaults`` (a task's own value
replaces the defaults' whole; ``null`` turns an inherited one off):

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

Errors name the field by its path in the config, e.g.
``demo.yaml:14: tasks[1].rules[2].theta: must be in (0, 1], got 1.5``.

A config file is untrusted input: it is read up to :data:`MAX_CONFIG_BYTES`, strict UTF-8,
its aliases may expand to at most :data:`MAX_CONFIG_NODES` values (an alias bomb is
refused before it is expanded), and a key given twice in one mapping is an error (YAML
would keep the last one silently). Notebook parameters are checked for type and range by
``batch.validate_parameters``, the checker the notebooks' validation cells call.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from relaxspec_audit.batch.notebooks import NOTEBOOKS, notebook_parameters
from relaxspec_audit.collect.config import (
    DTYPES,
    REPO_ROOT,
    TARGET_ONLY,
    ConfigError,
    RunConfig,
    task_slug,
)
from relaxspec_audit.verify.registry import RULES

#: Version of the batch config schema (the ``schema`` key; 1 when absent).
BATCH_SCHEMA_VERSION = 1
#: Rendered per task when the config does not say.
DEFAULT_NOTEBOOKS = ("rejection_anatomy", "fidelity", "choose_setting", "signoff")
#: Parameters the batch's own audit reads (``audit.audit_task``), whatever the notebooks.
AUDIT_TERMS = ("ni_margin", "alpha", "min_gain")
#: Notebook parameters the batch sets itself; a config may not set them.
BATCH_PARAMETERS = ("runs_dir", "task", "numbers_path")
#: Largest config file read, in bytes: a config is a page of YAML, not data.
MAX_CONFIG_BYTES = 1 << 20
#: Most values a config may hold with every alias expanded where it is used: nine nested
#: tenfold aliases are 10⁹ values in 300 bytes, and the plan walks every one of them.
MAX_CONFIG_NODES = 100_000
#: Deepest nesting of mappings and lists (the schema needs 5).
MAX_CONFIG_DEPTH = 50
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
#: Task keys that may also be given under ``defaults``: the plan's extra runs and checks.
_PLAN_KEYS = ("coupling", "noise_floor", "timing", "min_gain")
#: Defaults of the plan keys' own fields.
COUPLING_LIMIT = 20
FLOOR_LIMIT = 20
TIMING_DEFAULTS = {"items": 16, "repeats": 6}
DEFAULT_MIN_GAIN = 1.0
_MODEL_FIELDS = ("target", "draft")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class BatchConfigError(ValueError):
    """An invalid batch config; the message starts with ``[file:line: ]path``."""

    def __init__(
        self, path: str, message: str, *, source: str | None = None, line: int | None = None
    ):
        self.path = path
        self.message = message
        self.source = source
        self.line = line
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(f"{where}{path}: {message}")


# --------------------------------------------------------------------------- YAML with lines


class _LineDict(dict):
    """A mapping that remembers the 1-based line of each key (for error messages)."""

    lines: dict[Any, int]


class _LineList(list):
    """A list that remembers the 1-based line of each item."""

    lines: list[int]


class _YAMLProblem(Exception):
    """A config document refused while it is read (becomes a :class:`BatchConfigError`)."""

    def __init__(self, path: str, message: str, line: int):
        super().__init__(message)
        self.path = path
        self.message = message
        self.line = line


class _LineLoader(yaml.SafeLoader):
    """A safe loader that records lines, refuses duplicate keys and caps alias expansion."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.field_path: list[Any] = []  # keys and indices down to the node being built

    def construct_document(self, node: yaml.Node) -> Any:
        # Before anything is built: a bomb is refused from its few distinct nodes.
        _check_expansion(node)
        return super().construct_document(node)


def _field_path(parts: Sequence[Any]) -> str:
    """``["tasks", 1, "rules"]`` → ``tasks[1].rules`` (a config field path)."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top>"


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document deeper than MAX_CONFIG_DEPTH or larger than MAX_CONFIG_NODES.

    The size counts an aliased node at every use (what walking the loaded data costs),
    memoised per distinct node, so a billion-value bomb is measured in a few steps.

    Raises:
        _YAMLProblem: naming the line where the limit was crossed.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        line = node.start_mark.line + 1
        if id(node) in open_nodes:
            raise _YAMLProblem("<yaml>", "an alias refers to a node that contains it", line)
        if depth > MAX_CONFIG_DEPTH:
            raise _YAMLProblem("<yaml>", f"nested deeper than {MAX_CONFIG_DEPTH} levels", line)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        open_nodes.add(id(node))
        n = 1
        for child in children:
            n += size(child, depth + 1)
            if n > MAX_CONFIG_NODES:
                raise _YAMLProblem(
                    "<yaml>",
                    f"expands to more than {MAX_CONFIG_NODES} values with its aliases "
                    "expanded (an alias bomb?); write the values out or split the config",
                    child.start_mark.line + 1,
                )
        open_nodes.discard(id(node))
        sizes[id(node)] = n
        return n

    size(root, 0)


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    out = _LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            seen = key in out
        except TypeError:  # a list or mapping as a key
            raise _YAMLProblem(
                _field_path(loader.field_path),
                f"a key must be a name or a number, got a {type(key).__name__}",
                line,
            ) from None
        if seen:
            raise _YAMLProblem(
                _field_path([*loader.field_path, key]),
                f"duplicate key (first given at line {out.lines[key]}); give each key once",
                line,
            )
        loader.field_path.append(key)
        try:
            out[key] = loader.construct_object(value_node, deep=True)
        finally:
            loader.field_path.pop()
        out.lines[key] = line
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> _LineList:
    out = _LineList()
    for i, child in enumerate(node.value):
        loader.field_path.append(i)
        try:
            out.append(loader.construct_object(child, deep=True))
        finally:
            loader.field_path.pop()
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _line(container: Any, key: Any) -> int | None:
    lines = getattr(container, "lines", None)
    if lines is None:
        return None
    if isinstance(lines, dict):
        return lines.get(key)
    return lines[key] if isinstance(key, int) and 0 <= key < len(lines) else None


# --------------------------------------------------------------------------- config objects


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
        data = _read_yaml(path)
    else:
        data = config
    return _Validator(source).batch(data, path)


def _read_yaml(path: Path) -> Any:
    """Parse a config file within the size, UTF-8, nesting, alias and duplicate-key limits.

    Raises:
        BatchConfigError: naming the file, and the line and field where known.
    """
    source = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more, whatever the file claims
    except OSError as exc:
        raise BatchConfigError("<file>", f"cannot read: {exc}", source=source) from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise BatchConfigError(
            "<file>",
            f"larger than {MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES); a batch config is a "
            "page of YAML",
            source=source,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchConfigError(
            "<file>",
            f"not UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
            source=source,
            line=raw[: exc.start].count(b"\n") + 1,
        ) from exc
    try:
        return yaml.load(text, Loader=_LineLoader)
    except _YAMLProblem as exc:
        raise BatchConfigError(exc.path, exc.message, source=source, line=exc.line) from None
    except RecursionError:  # the composer recurses per nesting level, before our depth check
        raise BatchConfigError(
            "<yaml>", f"nested deeper than {MAX_CONFIG_DEPTH} levels", source=source
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BatchConfigError(
            "<yaml>",
            f"not valid YAML: {exc}",
            source=source,
            line=mark.line + 1 if mark is not None else None,
        ) from exc


class _Validator:
    """Walks a parsed config, building plans and raising errors with file:line: path."""

    def __init__(self, source: str | None):
        self.source = source

    def fail(self, path: str, message: str, container: Any = None, key: Any = None) -> None:
        raise BatchConfigError(path, message, source=self.source, line=_line(container, key))

    def mapping(
        self, value: Any, path: str, parent: Any, key: Any, allowed: Sequence[str]
    ) -> Mapping:
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
        self.mapping(defaults, "defaults", top, "defaults", (*_RUN_FIELDS, *_PLAN_KEYS))
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
        entry = self.mapping(entry, path, parent, index, (*_TASK_KEYS, *_RUN_FIELDS, *_PLAN_KEYS))
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
        plan = {k: self.plan_key(k, path, entry, defaults) for k in _PLAN_KEYS}
        return TaskPlan(
            task=task,
            runs=main,
            parameters=params,
            coupling_runs=self.coupling_runs(main, splits, *plan["coupling"]),
            floor_runs=self.floor_runs(main, *plan["noise_floor"]),
            timing=self.timing(*plan["timing"]),
            min_gain=self.min_gain(*plan["min_gain"]),
        )

    def plan_key(
        self, key: str, path: str, entry: Mapping, defaults: Mapping
    ) -> tuple[Any, str, Mapping]:
        """A plan key's value and where it was written: the task's own, else the defaults'."""
        if key in entry:
            return entry[key], f"{path}.{key}", entry
        return defaults.get(key), f"defaults.{key}", defaults

    def sub_int(self, block: Mapping, name: str, path: str, default: int, minimum: int) -> int:
        """An integer field of a plan-key mapping (``coupling.limit``, ``timing.items``)."""
        value = block.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(
                f"{path}.{name}", f"must be an integer >= {minimum}, got {value!r}", block, name
            )
        return value

    def coupling_runs(
        self,
        runs: tuple[RunConfig, ...],
        splits: list,
        value: Any,
        path: str,
        container: Mapping,
    ) -> tuple[RunConfig, ...]:
        """Each T > 0 relaxed setting again at another seed (the ``coupling`` key)."""
        if value is None:
            return ()
        block = self.mapping(value, path, container, path.rsplit(".", 1)[-1], ("seed", "limit"))
        limit = self.sub_int(block, "limit", path, COUPLING_LIMIT, 1)
        seed = block.get("seed")
        if seed is not None:
            self.sub_int(block, "seed", path, 0, 0)
        if "discovery" not in splits:
            self.fail(
                path,
                "needs the discovery split (the coupled pair is the main reference run on "
                f"discovery), but splits are {list(splits)}",
                container,
                path.rsplit(".", 1)[-1],
            )
        out: dict[str, RunConfig] = {}
        for run in runs:
            spec = RULES.get(run.rule)
            if spec is None or spec.lossless or run.greedy:
                continue  # target-only, references, and greedy decoding read no uniform
            other = run.seed + 1 if seed is None else seed
            if other == run.seed:
                self.fail(
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
        self, runs: tuple[RunConfig, ...], value: Any, path: str, container: Mapping
    ) -> tuple[RunConfig, ...]:
        """Each reference run again at another batch size or dtype (``noise_floor``)."""
        if value is None:
            return ()
        key = path.rsplit(".", 1)[-1]
        block = self.mapping(value, path, container, key, ("batch_size", "dtype", "limit"))
        if ("batch_size" in block) == ("dtype" in block):
            self.fail(path, "give exactly one of batch_size or dtype", container, key)
        limit = self.sub_int(block, "limit", path, FLOOR_LIMIT, 1)
        if "batch_size" in block:
            b = self.sub_int(block, "batch_size", path, 1, 1)
            change: dict[str, Any] = {"batch_size": b, "variant": f"floor-b{b}"}
        else:
            dtype = block["dtype"]
            choices = [d for d in DTYPES if d != "auto"]
            if dtype not in choices:
                self.fail(
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

    def timing(self, value: Any, path: str, container: Mapping) -> dict[str, int] | None:
        """The paired wall-clock pass: ``{items, repeats}``, None when off."""
        if value is None:
            return None
        block = self.mapping(
            value, path, container, path.rsplit(".", 1)[-1], tuple(TIMING_DEFAULTS)
        )
        return {
            "items": self.sub_int(block, "items", path, TIMING_DEFAULTS["items"], 1),
            # One repeat cannot show run-to-run noise, which the interval must include.
            "repeats": self.sub_int(block, "repeats", path, TIMING_DEFAULTS["repeats"], 2),
        }

    def min_gain(self, value: Any, path: str, container: Mapping) -> float:
        """The least modelled speed-up PASS needs (a number >= 0)."""
        if value is None:
            return DEFAULT_MIN_GAIN
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            self.fail(
                path,
                f"must be a number >= 0 (a speed-up; 1.0 = as fast as the reference), "
                f"got {value!r}",
                container,
                path.rsplit(".", 1)[-1],
            )
        return float(value)

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
        axes = [
            [(k, i, x) for i, x in enumerate(v)] if isinstance(v, list) else [(k, None, v)]
            for k, v in grid.items()
        ]
        runs: list[RunConfig] = []
        for combo in itertools.product(*axes):
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
        line = _line(container, "samples_per_item") if container is not None else None
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
                    line = _line(entry[k], i) if i is not None else _line(entry, k)
                    raise BatchConfigError(
                        at, message[len(k) + 1 :].strip(), source=self.source, line=line
                    ) from exc
            self.fail(path, message, entry, "rule")

    def model_paths(self, config: RunConfig, where: dict[str, tuple[str, Any]]) -> RunConfig:
        resolved = {}
        for name in _MODEL_FIELDS:
            value = getattr(config, name)
            found = _resolve_model(value)
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


def _at_most(limit: int, run_limit: int | None) -> int:
    """A replica's item limit: never more items than the run it is compared with has."""
    return limit if run_limit is None else min(limit, run_limit)


def _written(parameters: Mapping, name: str) -> str | None:
    """``name`` when a ``parameters`` block sets it, else None."""
    return name if name in parameters else None


def _resolve_model(value: str) -> str | None:
    # A local folder (as given, or relative to the repository for the bundled configs).
    for candidate in (Path(value).expanduser(), REPO_ROOT / value):
        if candidate.is_dir():
            return str(candidate.resolve())
    if re.fullmatch(r"[\w.-]+/[\w.-]+", value):
        # A hub id counts when it is already in the local cache (no network in audits).
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(value, "config.json")
        except Exception:
            hit = None
        if isinstance(hit, str):
            return value
    return None


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
