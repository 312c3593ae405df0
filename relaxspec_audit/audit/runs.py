"""A task's runs, read once from their typed manifests: lookup, labels, reference pairing.

A relaxed run is judged against the lossless reference run it pairs with request by
request (THEORY §3 for which reference, THEORY §4 for the pairing: same task items, seed
and sampling), and priced against the target-only run of its split. :class:`TaskRuns`
reads every manifest under a runs root once (:func:`~relaxspec_audit.collect.reader.
read_manifest`: configs rebuilt, rule parameters resolved by the registry) and answers
those questions from that one read; :func:`manifest_facts` states how the runs were made.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.audit.records import plain
from relaxspec_audit.audit.results import ManifestFacts
from relaxspec_audit.collect.config import task_slug
from relaxspec_audit.collect.costs import flagged_note
from relaxspec_audit.collect.manifest import RunManifest, priced_alike
from relaxspec_audit.verify import registry
from relaxspec_audit.verify.registry import TARGET_ONLY

#: What a report says when a task's runs carry no discovery/confirmation split: the
#: choice of a setting and its verdict need both (THEORY §3 "Choosing θ or a budget").
NO_SPLIT_NOTE = "runs have no discovery/confirmation split: no verdict; collect with --split"

# Config fields that, with the rule and its resolved params, make one setting: runs that
# differ in any of them measure different decoders and must never be pooled. The split,
# seed, limit and batch size are left out on purpose: pooling one setting across splits
# or seeds is a larger sample of the same decoder.
_SETTING_FIELDS = ("target", "draft", "temperature", "top_k", "top_p", "k", "max_new_tokens")

# Config fields two runs must share to be compared request by request (THEORY §4 pairing).
_PAIR_FIELDS = ("task", "split", "seed", "k", "temperature", "top_k", "top_p",
                "max_new_tokens", "target", "draft", "samples_per_item")  # fmt: skip

#: Column of a requests frame holding the modelled seconds of one target pass of its run
#: (``K·draft_step_s + verify_s``, or ``target_step_s`` for target-only decoding, from the
#: run's cost table; :func:`settings_frame` adds it).
PASS_COST = "pass_cost"
#: Column with the id of the cost table that priced the run (null: none).
COST_TABLE = "cost_table"
#: Column saying the run's cost table is flagged (``costs.flagged_note``; null: it is not).
COST_NOTE = "cost_note"

_SCHEMA = {
    "run_dir": pl.String, "run_id": pl.String, "task": pl.String, "rule": pl.String,
    "split": pl.String, "knob": pl.String, "value": pl.Float64, "setting": pl.String,
    "temperature": pl.Float64, "seed": pl.Int64, "k": pl.Int64, "max_new_tokens": pl.Int64,
    "n_requests": pl.Int64, "status": pl.String, "params": pl.String,
    "variant": pl.String, "_pair": pl.String,
}  # fmt: skip


def reference_rule(rule: str, temperature: float) -> str:
    """The lossless rule a relaxed rule is judged against (THEORY §3; the registry's)."""
    spec = registry.RULES.get(rule)
    return spec.reference_for(temperature) if spec else rule


def is_lossless(rule: str) -> bool:
    """A reference or the target-only baseline: never audited as relaxed."""
    return rule in registry.LOSSLESS


def _row(run_dir: str, manifest: RunManifest) -> dict[str, Any]:
    cfg = manifest.config
    spec = manifest.spec
    knob = spec.knob if spec else None
    value = getattr(manifest.params, knob) if knob else None
    return {
        "run_dir": run_dir,
        "run_id": manifest.run_id,
        "task": manifest.task_slug,
        "rule": cfg.rule,
        "split": cfg.split,
        "knob": knob,
        "value": float(value) if isinstance(value, int | float) else None,
        "setting": manifest.label,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "k": cfg.k,
        "max_new_tokens": cfg.max_new_tokens,
        "n_requests": manifest.n_requests,
        "status": manifest.status,
        "params": json.dumps(registry.params_dict(cfg.params), sort_keys=True),
        "variant": cfg.variant,
        "_pair": json.dumps([getattr(cfg, f) for f in _PAIR_FIELDS]),
    }


@dataclass(frozen=True)
class TaskRuns:
    """The runs of one task (or of every task) under a runs root, read once.

    Attributes:
        runs_dir: the runs root (or a run folder, or a list of them).
        task: the task (None: every task).
        manifests: every run's typed manifest, by run folder (replicas included).
        table: one row per main run (replicas left out: they repeat a main run's setting
            on another batch size, dtype or seed and must never be audited as one), columns
            ``run_dir, run_id, task, rule, split, knob, value, setting, temperature, seed,
            k, max_new_tokens, n_requests, status, params, variant`` (``params`` as
            canonical JSON), sorted by rule, value and split.
        every: the same with the replicas.
    """

    runs_dir: Any
    task: str | None
    manifests: Mapping[str, RunManifest]
    table: pl.DataFrame
    every: pl.DataFrame

    @classmethod
    def load(cls, runs_dir: str | Path | Iterable[str | Path], task: str | None = None) -> TaskRuns:
        """Read every run under ``runs_dir`` (of ``task`` when given).

        Raises:
            LogError: ``runs_dir`` holds no run folder, or a manifest that does not parse.
        """
        from relaxspec_audit.collect import logs

        manifests: dict[str, RunManifest] = {}
        rows = []
        for run_dir in logs.find_runs(runs_dir, variants=True):
            manifest = logs.read_manifest(run_dir)
            if task is not None and manifest.task_slug != task_slug(task):
                continue
            manifests[str(run_dir)] = manifest
            rows.append(_row(str(run_dir), manifest))
        every = pl.DataFrame(rows, schema=_SCHEMA).sort(["rule", "value", "split"], nulls_last=True)
        table = every.filter(pl.col("variant").is_null())
        # A task's runs are priced alike: two calibrations of one key become one table.
        priced = dict(zip(manifests, priced_alike(list(manifests.values())), strict=True))
        return cls(runs_dir, task, priced, table, every)

    def manifest(self, run_dir: str) -> RunManifest:
        """The manifest of one of the runs."""
        return self.manifests[str(run_dir)]

    def match(self, row: Mapping[str, Any], rule: str) -> str | None:
        """The main run of ``rule`` that pairs with ``row`` (same items, seed, sampling)."""
        hit = self.table.filter((pl.col("rule") == rule) & (pl.col("_pair") == row["_pair"]))
        return hit["run_dir"][0] if hit.height else None

    def reference_of(self, row: Mapping[str, Any]) -> tuple[str, str | None]:
        """``(reference rule, its paired run folder)`` of a run's row (itself if lossless)."""
        if is_lossless(row["rule"]):
            return row["rule"], None
        ref = reference_rule(row["rule"], row["temperature"])
        return ref, self.match(row, ref)

    def baseline_of(self, row: Mapping[str, Any]) -> str | None:
        """The target-only run of the same split and length (temperature does not matter)."""
        hit = self.table.filter(
            (pl.col("rule") == TARGET_ONLY)
            & (pl.col("split").eq_missing(row["split"]))
            & (pl.col("max_new_tokens") == row["max_new_tokens"])
        )
        return hit["run_dir"][0] if hit.height else None

    def replicas(self, row: Mapping[str, Any], prefix: str) -> pl.DataFrame:
        """Replica runs of ``row``'s rule whose variant starts with ``prefix``."""
        return self.every.filter(
            pl.col("variant").str.starts_with(prefix) & (pl.col("rule") == row["rule"])
        )

    def twin(self, replica: Mapping[str, Any]) -> str | None:
        """The main run a replica repeats (same rule, items, seed and sampling)."""
        return self.match(replica, replica["rule"])

    def coupling_replica(self, row: Mapping[str, Any]) -> str | None:
        """The ``coupling`` replica of a main run: same setting and split, another seed."""
        hit = self.every.filter(
            (pl.col("variant") == "coupling")
            & (pl.col("task") == row["task"])
            & (pl.col("rule") == row["rule"])
            & (pl.col("params") == row["params"])
            & (pl.col("split").eq_missing(row["split"]))
            & (pl.col("seed") != row["seed"])
        )
        return hit["run_dir"][0] if hit.height else None

    def run_dirs(
        self, *, rule: str | None = None, split: str | None = None, speculative: bool = False
    ) -> list[str]:
        """Main run folders, optionally of one rule, one split, or only speculative runs."""
        table = self.table
        if rule is not None:
            table = table.filter(pl.col("rule") == rule)
        if split is not None:
            table = table.filter(pl.col("split") == split)
        if speculative:
            table = table.filter(pl.col("rule") != TARGET_ONLY)
        return table["run_dir"].to_list()

    def split_note(self, splits: Sequence[str] = ("discovery", "confirmation")) -> str | None:
        """:data:`NO_SPLIT_NOTE` when no run carries the ``splits``, else None.

        Runs collected without ``--split`` have no discovery set to choose a setting on nor
        a disjoint confirmation set to judge it on (THEORY §3).
        """
        have = {s for s in self.table["split"].to_list() if s is not None}
        return NO_SPLIT_NOTE if self.table.height and not have & set(splits) else None

    def facts(self) -> ManifestFacts:
        """What a sign-off must state about how the main runs were made."""
        return manifest_facts([self.manifest(d) for d in self.table["run_dir"].to_list()])


def runs_table(runs_dir: str | Path, task: str | None = None, *, variants: bool = False) -> Any:
    """One row per run folder under ``runs_dir`` (of ``task``), from manifests (TaskRuns).

    Replica runs (a config ``variant``) are left out unless ``variants``.

    Raises:
        LogError: ``runs_dir`` holds no run folder.
    """
    runs = TaskRuns.load(runs_dir, task)
    return runs.every if variants else runs.table


def label_runs(frame: Any, runs: TaskRuns, on: str = "run") -> Any:
    """Add ``setting``, ``split``, ``value`` (and ``rule``) of each run to a frame keyed by run.

    ``logs.scan`` adds the run id as ``run``, so a scanned table (lazy or not) can be
    labelled before a statistic groups ``by=["setting"]``.
    """
    names = frame.collect_schema().names() if isinstance(frame, pl.LazyFrame) else frame.columns
    keep = ["run_id", *(c for c in ("setting", "split", "value", "rule") if c not in names)]
    table = runs.table.select(keep).rename({"run_id": on})
    return frame.join(table.lazy() if isinstance(frame, pl.LazyFrame) else table, on=on, how="left")


def runs_overview(runs: TaskRuns) -> pl.DataFrame:
    """The runs with their speed (``audit.speedup.speed`` per run): what ``collect`` shows."""
    from relaxspec_audit.audit.speedup import speed
    from relaxspec_audit.collect import logs

    dirs = runs.table["run_dir"].to_list()
    spd = speed(logs.scan(dirs, "rounds"), logs.scan(dirs, "requests"), by=["run"])
    spd = spd.select("run", "tau_mean", "alpha", "tokens_per_s", "passes_per_token")
    out = runs.table.join(spd.rename({"run": "run_id"}), on="run_id", how="left")
    return out.select(
        "rule", "setting", "split", "temperature", "k", "n_requests", "status",
        "tau_mean", "alpha", "tokens_per_s", "passes_per_token", "run_id",
    ).sort(["rule", "setting", "split"]).with_columns(pl.col("tau_mean").round(3))  # fmt: skip


def cost_warnings_of(manifests: Iterable[RunManifest]) -> list[str]:
    """Every warning of the tables that price the runs, once each, sorted."""
    tables = [m.cost_table for m in manifests if m.cost_table is not None]
    return sorted({w for t in tables for w in t.warnings})


def manifest_facts(manifests: Sequence[RunManifest]) -> ManifestFacts:
    """How the runs were made; values that differ between runs are listed, not hidden."""

    def distinct(values: Iterable[Any]) -> list[Any]:
        out = []
        for v in values:
            if v not in out:
                out.append(v)
        return out

    def blobs(values: Iterable[Any]) -> list[Any]:
        texts = distinct(json.dumps(plain(v), sort_keys=True, default=str) for v in values)
        return [json.loads(x) for x in texts]

    statuses: dict[str, int] = {}
    for m in manifests:
        statuses[str(m.status)] = statuses.get(str(m.status), 0) + 1
    commits = distinct(m.git_commit for m in manifests)
    return ManifestFacts(
        n_runs=len(manifests),
        models=blobs(m.models for m in manifests),
        seeds=distinct(m.config.seed for m in manifests),
        k=distinct(m.config.k for m in manifests),
        temperatures=distinct(m.config.temperature for m in manifests),
        max_new_tokens=distinct(m.config.max_new_tokens for m in manifests),
        package_version=", ".join(str(v) for v in distinct(m.package_version for m in manifests)),
        git_commit=commits[0] if len(commits) == 1 else commits,
        versions=blobs(m.versions for m in manifests),
        hosts=distinct(m.host for m in manifests),
        started_at=min((m.started_at or "" for m in manifests), default=None),
        ended_at=max((m.ended_at or "" for m in manifests), default=None),
        cost_warnings=cost_warnings_of(manifests),
        statuses=statuses,
    )


def setting_key(manifest: RunManifest) -> dict[str, Any]:
    """The setting a run measures: rule, resolved params, pair and sampling settings.

    Two runs with equal keys decode with one decoder (same rule and canonical params; same
    target and draft; same temperature, top-k, top-p, K and length), so their requests may
    be pooled; the split and seed are not part of it.
    """
    cfg = manifest.config
    key: dict[str, Any] = {"rule": cfg.rule, "params": registry.params_dict(cfg.params)}
    for field in _SETTING_FIELDS:
        value = getattr(cfg, field)
        key[field] = _model_identity(value) if field in ("target", "draft") else value
    # A replica (noise floor at another batch size or dtype, coupling on another seed)
    # repeats its main run's items: pooled with it, those items would count twice.
    key["variant"] = cfg.variant
    return key


def _model_identity(path: Any) -> Any:
    """A local model folder as its resolved path (a hub id as given).

    ``runs/../target`` and ``target/`` are one model; the raw strings would split them.
    """
    if path and Path(str(path)).exists():
        return str(Path(str(path)).resolve())
    return path


def _key_label(key: Mapping[str, Any]) -> str:
    """``nucleus θ=0.95`` plus the pair and sampling settings, for a refusal message."""
    rule = key["rule"]
    label = registry.setting_label(rule, key["params"]) if rule in registry.RULES else rule
    rest = ", ".join(f"{f}={key[f]}" for f in _SETTING_FIELDS)
    return f"{label} ({rest})"


def check_one_setting(run_dirs: Any, what: str = "runs") -> dict[str, Any] | None:
    """Refuse a selection of runs that mixes settings (:func:`setting_key`).

    ``run_dirs`` are run folders or parents of run folders. Runs of one setting on several
    splits or seeds pass: they are one decoder's sample.

    Returns:
        The common setting key, or None when ``run_dirs`` is empty.

    Raises:
        ValueError: ``"<what>: the selection mixes N settings: … (run=…, …); …"``, naming
            every run it matched by setting.
    """
    from relaxspec_audit.collect import logs

    groups: dict[str, list[str]] = {}
    keys: dict[str, dict[str, Any]] = {}
    for run_dir in logs.find_runs(run_dirs) if run_dirs else []:
        manifest = logs.read_manifest(run_dir)
        key = setting_key(manifest)
        blob = json.dumps(key, sort_keys=True, default=str)
        keys[blob] = key
        groups.setdefault(blob, []).append(str(manifest.run_id or Path(run_dir).name))
    if len(groups) > 1:
        listed = "; ".join(
            f"{_key_label(keys[b])}: run={', run='.join(ids)}" for b, ids in groups.items()
        )
        raise ValueError(
            f"{what}: the selection mixes {len(groups)} settings and would pool them: "
            f"{listed}. Select the runs of one setting (pooling one setting across splits "
            "or seeds is fine)"
        )
    return next(iter(keys.values()), None)


def setting_params(rule: str) -> tuple[str, ...]:
    """The parameters that define a setting of ``rule`` (the registry's, in its order)."""
    from relaxspec_audit.verify.registry import RULES

    return RULES[rule].param_names if rule in RULES else ()


def pass_cost(manifest: RunManifest) -> float | None:
    """Modelled seconds of one target pass of a run (:attr:`RunManifest.pass_cost`).

    A speculative round is K draft steps and one verify pass of K+1 tokens; a target-only
    token is one target step (docs/STATISTICS.md §7). None without a cost table.

    Raises:
        ValueError: the run's K is not its cost table's (the verify pass would be
            mispriced), naming both.
    """
    return manifest.pass_cost


def settings_frame(manifests: Sequence[RunManifest]) -> pl.DataFrame:
    """One row per run: ``run``, ``rule``, ``pass_cost``, ``cost_table``, ``cost_note``, params.

    Join it to a ``requests`` scan on ``run`` (the hive key of ``logs.scan``) to get the
    setting columns :func:`frontier` groups by, and each run's modelled cost of a target
    pass (:func:`pass_cost`; null without a cost table). Parameters are resolved by the
    registry (defaults filled in), so a run at the default θ and one that names θ = 0.95
    are the same setting, and a setting given only its budget has its gate and cap too.
    """
    from relaxspec_audit.verify.registry import params_dict

    rows = []
    for m in manifests:
        table = m.cost_table
        row = {"run": m.run_id, "rule": m.rule, PASS_COST: m.pass_cost,
               COST_TABLE: table.id if table is not None else None,
               COST_NOTE: flagged_note(table.warnings) if table is not None else None}  # fmt: skip
        row.update(params_dict(m.params))
        rows.append(row)
    # An int parameter that is ∞ in some run (an uncapped ASD) is a float column.
    floats = {k for row in rows for k, v in row.items() if isinstance(v, float)}
    floats.add(PASS_COST)
    rows = [
        {k: float(v) if k in floats and v is not None else v for k, v in row.items()}
        for row in rows
    ]
    schema = {PASS_COST: pl.Float64, COST_TABLE: pl.String, COST_NOTE: pl.String}
    return pl.DataFrame(rows, schema_overrides=schema)
