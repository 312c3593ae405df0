"""One validated, frozen, serialisable configuration per run (the single source of defaults).

A run is one (model pair, task, rule, rule parameters, seed, K, sampling settings), see
docs/ARCHITECTURE.md "Logs". :class:`RunConfig` holds exactly that, with the rule's
parameters resolved once into the rule's typed params object
(:func:`relaxspec_audit.verify.registry.resolve_params`); :meth:`RunConfig.run_id`
hashes everything that changes the logged output, so re-running the same configuration
resumes into the same run folder
(``<out>/task=<task>/rule=<rule>/run=<run_id>/``).

What ``run_id`` covers: the task and split, both models (repository paths made portable),
the rule and its resolved parameters (defaults included, so ``{}`` and ``{"theta": 0.95}``
are one run), K, the sampling settings (temperature, top-k, top-p), ``max_new_tokens``, the
seed, the device and dtype, ``log_positions``, the θ grid of the logged ``es``, and —
only when they differ from their defaults, so that every run id from before they existed
is unchanged — ``samples_per_item`` (when > 1) and ``variant`` (when set). It does
not cover ``limit`` (a larger limit resumes the run and adds requests), nor ``batch_size``
and what else changes timings (threads, chunking): floats differ across batch sizes only
within a tolerance and decisions only from a near-tie on (THEORY §4).

This module is imported by the CLI and the statistics layer, so it must not import torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec_audit.verify import registry
from relaxspec_audit.verify.params import bad_thetas
from relaxspec_audit.verify.registry import TARGET_ONLY

#: Repository root (this module lives in ``<root>/relaxspec_audit/collect``); the embedded
#: pair is resolved against it so that the defaults work from any working directory.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The embedded model pair trained by ``tools/zoo.py`` (docs/ARCHITECTURE.md "The embedded pair").
EMBEDDED_DIR = REPO_ROOT / "data" / "models" / "arith"
DEFAULT_TARGET = str(EMBEDDED_DIR / "target")
DEFAULT_DRAFT = str(EMBEDDED_DIR / "draft")
#: θ grid on which ``E_S`` is logged at every position (THEORY §2.3, §3 deviation accounting).
DEFAULT_THETA_GRID: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
SPLITS = (None, "discovery", "confirmation")
#: A device: ``auto`` (cuda if available, else cpu), ``cpu``, ``mps``, ``cuda`` or ``cuda:N``.
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DTYPES = ("auto", "float32", "float16", "bfloat16")
#: Fields that do not change what a request's logs contain: a larger ``limit`` resumes the
#: same run folder and only adds requests; ``batch_size`` changes speed, and floats only
#: within a tolerance (decisions up to the first near-tie, THEORY §4), so a run resumed at
#: another batch size stays one run.
_NOT_IN_RUN_ID = ("limit", "batch_size", "cuda_graphs")
#: Fields hashed into ``run_id`` only when they differ from these defaults: added after run
#: ids were in use, they must leave every existing id unchanged.
_IN_RUN_ID_UNLESS_DEFAULT = {"samples_per_item": 1, "variant": None}
#: A variant label: a short slug (it separates replica runs, e.g. ``floor-b1``, ``coupling``).
VARIANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")


class ConfigError(ValueError):
    """An invalid run configuration; ``field`` names the offending field."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run. Validate with :meth:`validate` before use.

    Attributes:
        task: task name from the registry (``tasks.load_task``) or a path to a JSONL file.
        split: ``"discovery"``, ``"confirmation"`` or None for every item.
        limit: decode at most this many items (None: all).
        target: path or hub id of the target causal LM.
        draft: path or hub id of the draft causal LM (same vocabulary as the target).
        rule: a rule of ``registry.RULES`` or ``"target"`` (target-only decoding).
        params: the rule's resolved params object (``registry.resolve_params``; None for
            target-only). A mapping of overrides is resolved on construction, so every
            RunConfig carries its parameters resolved; invalid ones raise ConfigError.
        k: draft tokens per round (K, THEORY §1).
        temperature: sampling temperature applied to p and q alike; 0 means greedy.
        top_k: keep only the k most likely tokens of p and q (None: off).
        top_p: keep the top-p nucleus of p and q before sampling (None: off).
        max_new_tokens: stop a request after this many emitted tokens.
        seed: seed of the coupled random stream (THEORY §4).
        device: ``"auto"`` (cuda if available, else cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        dtype: ``"auto"`` (float32 on cpu, bfloat16 on cuda) or a torch dtype name.
        log_positions: write the per-position table (off only for speed comparisons).
        batch_size: requests decoded per target pass by the batched engine (None: the
            device's automatic choice, ``collect.batched.AUTO_BATCH``). Not in ``run_id``.
        theta_grid: θ values at which ``E_S`` is logged per position.
        samples_per_item: completions per item, each with its own keys of the coupled
            stream: sample 0 has request id = item id (so a one-sample run is what it
            always was), sample ``j ≥ 1`` has request id ``f"{item_id}#{j}"``. Sample j of
            two rules on one seed share their stream (THEORY §4). Needs temperature > 0:
            greedy samples are identical. In ``run_id`` when > 1.
        variant: a label that separates replica runs of one setting from the main one
            (``"coupling"``, ``"floor-b1"``, ``"floor-float32"``); a short slug. In
            ``run_id`` when set.
        cuda_graphs: replay the batched engine's fixed-shape draft, verify and
            target-only calls from captured CUDA graphs (``collect.graphs``); needs a CUDA
            device and the static-cache path. The same kernels run, so it is not in
            ``run_id``; the manifest's ``engine`` records it.
    """

    task: str = "arith"
    split: str | None = None
    limit: int | None = None
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    rule: str = "exact"
    params: Any = None
    k: int = 5
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 64
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    log_positions: bool = True
    theta_grid: tuple[float, ...] = DEFAULT_THETA_GRID
    batch_size: int | None = None
    samples_per_item: int = 1
    variant: str | None = None
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        # JSON gives lists; keep the grid hashable.
        object.__setattr__(self, "theta_grid", tuple(float(t) for t in self.theta_grid))
        object.__setattr__(self, "params", self._resolve(self.params))
        # One spelling per decoding, so one run id: temperature 0 (a YAML int) is 0.0, and
        # top-p 1 keeps every token, the same decoding as no top-p.
        if _is_number(self.temperature):
            object.__setattr__(self, "temperature", float(self.temperature))
        if _is_number(self.top_p):
            object.__setattr__(self, "top_p", None if self.top_p == 1 else float(self.top_p))

    def _resolve(self, raw: Any) -> Any:
        """Resolve once: every later reader gets the typed params, defaults filled in."""
        if self.rule == TARGET_ONLY:
            if raw:
                raise ConfigError("params", f"target-only decoding takes none, got {raw}")
            return None
        if not isinstance(self.rule, str) or self.rule not in registry.RULES:
            known = sorted([*registry.RULES, TARGET_ONLY])
            raise ConfigError("rule", f"unknown rule {self.rule!r}; known: {', '.join(known)}")
        try:
            return registry.resolve_params(self.rule, raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError("params", f"rule {self.rule!r}: {exc}") from exc

    def __hash__(self) -> int:
        return hash(self.to_json())

    @property
    def greedy(self) -> bool:
        """Whether the run decodes in greedy mode (temperature 0)."""
        return self.temperature == 0

    def validate(self) -> RunConfig:
        """Check every field; return self so that calls can be chained.

        Raises:
            ConfigError: naming the first invalid field.
        """
        _check_int(self, "k", minimum=1)
        _check_int(self, "max_new_tokens", minimum=1)
        _check_int(self, "seed", minimum=0)
        if self.limit is not None:
            _check_int(self, "limit", minimum=1)
        if self.batch_size is not None:
            _check_int(self, "batch_size", minimum=1)
        if not isinstance(self.task, str) or not self.task:
            raise ConfigError("task", f"must be a non-empty string, got {self.task!r}")
        if self.split not in SPLITS:
            raise ConfigError("split", f"must be one of {SPLITS}, got {self.split!r}")
        for name in ("target", "draft"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(name, f"must be a model path or id, got {value!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise ConfigError("temperature", f"must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError("temperature", f"must be finite and >= 0, got {self.temperature}")
        if self.top_k is not None:
            _check_int(self, "top_k", minimum=1)
        if self.top_p is not None and not (
            isinstance(self.top_p, int | float) and 0 < self.top_p <= 1
        ):
            raise ConfigError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.device, str) or not DEVICE_PATTERN.fullmatch(self.device):
            raise ConfigError(
                "device", f"must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.log_positions, bool):
            raise ConfigError("log_positions", f"must be a bool, got {self.log_positions!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError("cuda_graphs", f"must be a bool, got {self.cuda_graphs!r}")
        if self.cuda_graphs and self.device in ("cpu", "mps"):
            raise ConfigError("cuda_graphs", f"needs a CUDA device, got device {self.device!r}")
        if not self.theta_grid or bad_thetas(self.theta_grid):
            raise ConfigError("theta_grid", f"must be non-empty, in (0, 1], got {self.theta_grid}")
        _check_int(self, "samples_per_item", minimum=1)
        if self.samples_per_item > 1 and self.greedy:
            raise ConfigError(
                "samples_per_item",
                f"{self.samples_per_item} samples at temperature 0 (greedy) are identical "
                "and buy nothing; use 1, or a temperature > 0",
            )
        if self.variant is not None and not (
            isinstance(self.variant, str) and VARIANT_PATTERN.fullmatch(self.variant)
        ):
            raise ConfigError(
                "variant",
                "must be a short slug (lower-case letters, digits, '.', '_', '-'; at most "
                f"32 characters), got {self.variant!r}",
            )
        self._validate_rule()
        return self

    def _validate_rule(self) -> None:
        # Rule and parameters were resolved on construction; what is left ties them to
        # the sampling settings.
        spec = registry.RULES.get(self.rule)
        problem = registry.check_greedy(spec, self.temperature) if spec else None
        if problem:
            raise ConfigError("temperature", problem)

    @property
    def spec(self) -> registry.RuleSpec | None:
        """The rule's registry entry; None for target-only decoding."""
        return registry.RULES.get(self.rule)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["params"] = registry.params_dict(self.params)
        out["theta_grid"] = list(self.theta_grid)
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys), so equal configs serialise identically."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from :meth:`to_dict` output; unknown keys raise :class:`ConfigError`."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                unknown[0], f"unknown config field (known: {', '.join(sorted(known))})"
            )
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    def run_id(self) -> str:
        """Short stable hash of everything that changes the output (12 hex chars).

        Model paths inside the repository are hashed relative to it, so the embedded pair
        gives the same id on every checkout. ``limit`` is left out: a larger limit resumes
        the same run folder. ``samples_per_item`` and ``variant`` enter only when they
        differ from their defaults, so ids from before they existed still hold.
        """
        data = self.to_dict()
        for name in _NOT_IN_RUN_ID:
            data.pop(name)
        for name, default in _IN_RUN_ID_UNLESS_DEFAULT.items():
            if data[name] == default:
                data.pop(name)
        for name in ("target", "draft"):
            data[name] = _portable_path(data[name])
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def run_dir(self, out: str | Path) -> Path:
        """The run folder under ``out``: ``task=<task>/rule=<rule>/run=<run_id>``."""
        return (
            Path(out)
            / f"task={task_slug(self.task)}"
            / f"rule={self.rule}"
            / f"run={self.run_id()}"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_int(cfg: RunConfig, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, got {value!r}")


def _portable_path(value: str) -> str:
    try:
        return Path(value).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return value


#: Separates an item id from its sample index in a request id (``"item#2"``).
SAMPLE_SEP = "#"


def sample_request_id(item_id: str, sample: int) -> str:
    """The request id of an item's sample: the item id for sample 0, else ``item_id#sample``.

    The request id keys the coupled random stream (``rng.request_key``, THEORY §4), so each
    sample has its own stream, sample j of two runs on one seed share theirs, and a
    one-sample run keeps the request ids (and draws) it always had.
    """
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"sample: must be an integer >= 0, got {sample!r}")
    return item_id if sample == 0 else f"{item_id}{SAMPLE_SEP}{sample}"


def task_slug(task: str) -> str:
    """The hive key of a task: its name, or the file stem of a task given as a path."""
    # A task given as a path becomes its file stem so that the hive key stays one segment.
    if "/" in task or task.endswith(".jsonl"):
        return Path(task).stem
    return task
