"""Batch config: the YAML schema, its validation (every field, before any work) and the plan.

A config is read with line numbers, validated as a whole (tasks, rules, rule parameters,
every RunConfig field, model paths, notebook parameters) and expanded into one
:class:`TaskPlan` per task: its runs (rule grids × splits) and its notebook parameters.

Config schema (version 1), see ``relaxspec_audit/configs/demo.yaml`` for an example::

    batch: demo                  # name: reports go to <out>/<batch>/
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

Errors name the field by its path in the config, e.g.
``demo.yaml:14: tasks[1].rules[2].theta: must be in (0, 1], got 1.5``. Deprecated
spellings (a rule's old parameter names, the notebook parameter ``margin`` for
``ni_margin``) are mapped with a ``FutureWarning`` naming the file and line.

A config file is untrusted input: it is read up to :data:`MAX_CONFIG_BYTES`, strict UTF-8,
its aliases may expand to at most :data:`MAX_CONFIG_NODES` values (an alias bomb is
refused before it is expanded), and a key given twice in one mapping is an error (YAML
would keep the last one silently). Notebook parameters are checked for type and range by
``report.validate_parameters``, the checker the notebooks' validation cells call.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from relaxspec_audit.batch.notebooks import NOTEBOOKS, notebook_parameters
from relaxspec_audit.collect.config import REPO_ROOT, TARGET_ONLY, ConfigError, RunConfig, task_slug
from relaxspec_audit.verify.registry import RULES

#: Version of the batch config schema (the ``schema`` key; 1 when absent).
BATCH_SCHEMA_VERSION = 1
#: Rendered per task when the config does not say.
DEFAULT_NOTEBOOKS = ("rejection_anatomy", "fidelity", "choose_setting", "signoff")
#: Notebook parameters the batch sets itself; a config may not set them.
BATCH_PARAMETERS = ("runs_dir", "task", "numbers_path")
#: Deprecated notebook-parameter names, mapped (with a ``FutureWarning``) to the new ones.
PARAMETER_ALIASES = {"margin": "ni_margin"}
#: Largest config file read, in bytes: a config is a page of YAML, not data.
MAX_CONFIG_BYTES = 1 << 20
#: Most values a config may hold with every alias expanded where it is used: nine nested
#: tenfold aliases are 10⁹ values in 300 bytes, and the plan walks every one of them.
MAX_CONFIG_NODES = 100_000
#: Deepest nesting of mappings and lists (the schema needs 5).
MAX_CONFIG_DEPTH = 50
#: Bundled configs (package data).
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

_TOP_KEYS = ("schema", "batch", "defaults", "notebooks", "parameters", "tasks")
_TASK_KEYS = ("task", "splits", "rules", "parameters")
# RunConfig fields a config sets per task/rule; task, split, rule and params are structural.
_RUN_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(RunConfig)
    if f.name not in ("task", "split", "rule", "params")
)
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
        runs: every run the task's reports read, validated.
        parameters: notebook parameters (config-wide merged with the task's own).
    """

    task: str
    runs: tuple[RunConfig, ...]
    parameters: dict[str, Any] = field(default_factory=dict)

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
    """

    name: str
    tasks: tuple[TaskPlan, ...]
    notebooks: tuple[str, ...] = DEFAULT_NOTEBOOKS
    source: Path | None = None

    def all_runs(self) -> list[RunConfig]:
        """Every distinct run of the batch (a run shared by two tasks is collected once)."""
        seen: dict[str, RunConfig] = {}
        for plan in self.tasks:
            for run in plan.runs:
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
        defaults = top.get("defaults", {}) or {}
        self.mapping(defaults, "defaults", top, "defaults", _RUN_FIELDS)
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
        return BatchConfig(name=name, tasks=tuple(plans), notebooks=notebooks, source=path)

    def notebooks(self, top: Mapping) -> tuple[str, ...]:
        value = top.get("notebooks", list(DEFAULT_NOTEBOOKS))
        if not isinstance(value, list) or not value:
            self.fail("notebooks", f"must be a non-empty list, got {value!r}", top, "notebooks")
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
        out = dict(value)
        for old, new in PARAMETER_ALIASES.items():
            if old not in out:
                continue
            if new in out:
                self.fail(f"{path}.{old}", f"give {new} only ({old} is its old name)", value, old)
            where = f"{self.source or 'config'}:{_line(value, old) or '?'}"
            warnings.warn(
                f"{where}: {path}.{old}: deprecated, use {new!r} (the non-inferiority margin "
                f"δ; `{old}` is a verification rule)",
                FutureWarning,  # shown by default: configs are written by users
                stacklevel=2,
            )
            out[new] = out.pop(old)
        return out

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
        entry = self.mapping(entry, path, parent, index, (*_TASK_KEYS, *_RUN_FIELDS))
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
        origin = {k: ("defaults", defaults) for k in defaults}
        origin.update({k: (path, entry) for k in entry if k in _RUN_FIELDS})
        base = {k: defaults[k] for k in defaults} | {k: entry[k] for k in entry if k in _RUN_FIELDS}
        runs: dict[str, RunConfig] = {}
        for j, rule_entry in enumerate(rules_):
            for run in self.rule(
                rule_entry, f"{path}.rules[{j}]", rules_, j, task, splits, entry, base, origin
            ):
                runs.setdefault(run.to_json(), run)
        params = shared | self.parameters(
            entry.get("parameters", {}) or {}, f"{path}.parameters", entry, "parameters"
        )
        return TaskPlan(task=task, runs=tuple(runs.values()), parameters=params)

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
            # Resolved once (one deprecation warning per entry, not one per split).
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

    def rule_params(self, rule: str, params: dict, combo: tuple, path: str, entry: Mapping) -> Any:
        """The rule's resolved params (None for target-only); errors name field and line."""
        if rule == TARGET_ONLY:
            return None
        from relaxspec_audit.verify.registry import resolve_params

        first = next(iter(combo), None)
        where = f"{self.source or 'config'}:{_line(entry, first[0]) if first else '?'}"
        try:
            return resolve_params(rule, params, where=where)
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
                if not any(name in d for d in declared.values()):
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
        from relaxspec_audit.report.parameters import validate_parameters

        blocks = [("parameters", top.get("parameters") or {})]
        for i, entry in enumerate(tasks):
            blocks.append((f"tasks[{i}].parameters", entry.get("parameters") or {}))
        for path, block in blocks:
            for key, value in block.items():
                name = PARAMETER_ALIASES.get(key, key)
                try:
                    validate_parameters(**{name: value})
                except ValueError as exc:
                    message = str(exc).removeprefix(f"{name}: ")
                    self.fail(f"{path}.{key}", message, block, key)


def _written(parameters: Mapping, name: str) -> str | None:
    """The key ``name`` was written as in a ``parameters`` block (maybe its old spelling)."""
    if name in parameters:
        return name
    old = next((o for o, n in PARAMETER_ALIASES.items() if n == name and o in parameters), None)
    return old


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
    """Keys a rule entry may set: the rule's parameters and their deprecated spellings."""
    if rule == TARGET_ONLY:
        return ()
    if not isinstance(rule, str) or rule not in RULES:
        return None
    return tuple(name for p in RULES[rule].params for name in (p.name, *p.info.aliases))


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
