"""The runs of a task, read from their manifests: lookup, labels, reference pairing.

A relaxed run is judged against the lossless reference run it pairs with request by
request (THEORY §3 for which reference, THEORY §4 for the pairing: same task items, seed and
sampling); :func:`manifest_facts` states how the runs were made, for the sign-off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaxspec_audit.report.jsonio import _jsonable
from relaxspec_audit.verify import registry
from relaxspec_audit.verify.registry import LOSSLESS, setting_label

__all__ = [
    "LOSSLESS",
    "NO_SPLIT_NOTE",
    "check_one_setting",
    "reference_rule",
    "runs_table",
    "setting_key",
    "setting_label",
    "split_note",
]

#: What a report says when a task's runs carry no discovery/confirmation split: the
#: choice of a setting and its verdict need both (THEORY §3 "Choosing θ or a budget").
NO_SPLIT_NOTE = "runs have no discovery/confirmation split: no verdict; collect with --split"

# Config fields that, with the rule and its resolved params, make one setting: runs that
# differ in any of them measure different decoders and must never be pooled. The split,
# seed, limit and batch size are left out on purpose: pooling one setting across splits
# or seeds is a larger sample of the same decoder.
_SETTING_FIELDS = ("target", "draft", "temperature", "top_k", "top_p", "k", "max_new_tokens")

# Config fields two runs must share to be compared request by request (THEORY §4 pairing),
# with the value a run written before the field existed stands for.
_PAIR_FIELDS = {"task": None, "split": None, "seed": None, "k": None, "temperature": None,
                "top_k": None, "top_p": None, "max_new_tokens": None, "target": None,
                "draft": None, "samples_per_item": 1}  # fmt: skip


def runs_table(runs_dir: str | Path, task: str | None = None, *, variants: bool = False) -> Any:
    """One row per run folder under ``runs_dir`` (optionally of one task), from manifests.

    Replica runs (a config ``variant`` such as ``floor-b1`` or ``coupling``: the noise
    floor's and the coupling estimate's extra runs) are left out unless ``variants``:
    they repeat a main run's setting and must never be audited as one.

    Returns:
        A polars DataFrame with columns ``run_dir, run_id, task, rule, split, knob, value,
        setting, temperature, seed, k, max_new_tokens, n_requests, status, params,
        variant`` (``params`` as canonical JSON), sorted by rule, value and split.

    Raises:
        LogError: ``runs_dir`` holds no run folder.
    """
    import polars as pl

    from relaxspec_audit.collect import logs
    from relaxspec_audit.collect.config import task_slug

    rows = []
    for run_dir in logs.find_runs(runs_dir, variants=variants):
        manifest = logs.read_manifest(run_dir)
        cfg = manifest.get("config", {})
        if task is not None and task_slug(str(cfg.get("task"))) != task_slug(task):
            continue
        if cfg.get("variant") and not variants:
            continue
        rule = str(cfg.get("rule"))
        spec = registry.RULES.get(rule)
        # Resolved once here: every column below reads the same typed params.
        params = registry.resolve_params(rule, cfg.get("params")) if spec else None
        knob = spec.knob if spec else None
        value = getattr(params, knob) if knob else None
        rows.append(
            {
                "run_dir": str(run_dir),
                "run_id": manifest.get("run_id"),
                "task": task_slug(str(cfg.get("task"))),
                "rule": rule,
                "split": cfg.get("split"),
                "knob": knob,
                "value": float(value) if value is not None else None,
                "setting": setting_label(rule, params),
                "temperature": float(cfg.get("temperature", 0.0)),
                "seed": cfg.get("seed"),
                "k": cfg.get("k"),
                "max_new_tokens": cfg.get("max_new_tokens"),
                "n_requests": manifest.get("n_requests"),
                "status": manifest.get("status"),
                "params": json.dumps(registry.params_dict(params), sort_keys=True),
                "variant": cfg.get("variant"),
                "_pair": json.dumps([cfg.get(f, d) for f, d in _PAIR_FIELDS.items()]),
            }
        )
    schema = {
        "run_dir": pl.String, "run_id": pl.String, "task": pl.String, "rule": pl.String,
        "split": pl.String, "knob": pl.String, "value": pl.Float64, "setting": pl.String,
        "temperature": pl.Float64, "seed": pl.Int64, "k": pl.Int64, "max_new_tokens": pl.Int64,
        "n_requests": pl.Int64, "status": pl.String, "params": pl.String,
        "variant": pl.String, "_pair": pl.String,
    }  # fmt: skip
    df = pl.DataFrame(rows, schema=schema)
    return df.sort(["rule", "value", "split"], nulls_last=True)


def reference_rule(rule: str, temperature: float) -> str:
    """The lossless rule a relaxed rule is judged against (THEORY §3; the registry's)."""
    spec = registry.RULES.get(rule)
    return spec.reference_for(temperature) if spec else rule


def _match(table: Any, row: Mapping[str, Any], rule: str) -> str | None:
    """Run folder of ``rule`` that pairs with ``row`` (same task items, seed, sampling)."""
    import polars as pl

    hit = table.filter((pl.col("rule") == rule) & (pl.col("_pair") == row["_pair"]))
    return hit["run_dir"][0] if hit.height else None


def _baseline(table: Any, row: Mapping[str, Any]) -> str | None:
    """Target-only run of the same split and length (temperature does not matter for speed)."""
    import polars as pl

    hit = table.filter(
        (pl.col("rule") == "target")
        & (pl.col("split").eq_missing(row["split"]))
        & (pl.col("max_new_tokens") == row["max_new_tokens"])
    )
    return hit["run_dir"][0] if hit.height else None


def run_dirs(
    runs_dir: str | Path,
    task: str,
    *,
    rule: str | None = None,
    split: str | None = None,
    speculative: bool = False,
) -> list[str]:
    """Run folders of a task, optionally of one rule, one split, or only speculative runs.

    Args:
        runs_dir: folder of run folders.
        task: task name.
        rule: keep only this rule.
        split: keep only this split.
        speculative: drop target-only runs (they verify no drafts).
    """
    import polars as pl

    table = runs_table(runs_dir, task)
    if rule is not None:
        table = table.filter(pl.col("rule") == rule)
    if split is not None:
        table = table.filter(pl.col("split") == split)
    if speculative:
        table = table.filter(pl.col("rule") != "target")
    return table["run_dir"].to_list()


def label_runs(frame: Any, runs_dir: str | Path, task: str, on: str = "run") -> Any:
    """Add ``setting``, ``split``, ``value`` (and ``rule``) of each run to a frame keyed by run.

    ``logs.scan`` adds the run id as ``run``, so a scanned table (lazy or not) can be
    labelled before a statistic groups ``by=["setting"]``.
    """
    import polars as pl

    names = frame.collect_schema().names() if isinstance(frame, pl.LazyFrame) else frame.columns
    keep = ["run_id", *(c for c in ("setting", "split", "value", "rule") if c not in names)]
    table = runs_table(runs_dir, task).select(keep).rename({"run_id": on})
    return frame.join(table.lazy() if isinstance(frame, pl.LazyFrame) else table, on=on, how="left")


def runs_overview(runs_dir: str | Path, task: str) -> Any:
    """Runs of a task with their speed (``audit.speed`` per run): what ``collect`` shows."""
    import polars as pl

    from relaxspec_audit import audit as stats
    from relaxspec_audit.collect import logs

    table = runs_table(runs_dir, task)
    dirs = table["run_dir"].to_list()
    spd = stats.speed(logs.scan(dirs, "rounds"), logs.scan(dirs, "requests"), by=["run"])
    spd = spd.select("run", "tau_mean", "alpha", "tokens_per_s", "passes_per_token")
    out = table.join(spd.rename({"run": "run_id"}), on="run_id", how="left")
    return out.select(
        "rule", "setting", "split", "temperature", "k", "n_requests", "status",
        "tau_mean", "alpha", "tokens_per_s", "passes_per_token", "run_id",
    ).sort(["rule", "setting", "split"]).with_columns(pl.col("tau_mean").round(3))  # fmt: skip


def manifest_facts(runs_dir: str | Path, task: str) -> dict[str, Any]:
    """What a sign-off must state about how the runs were made (from their manifests).

    Returns:
        ``{"models": {...}, "seeds": [...], "k": [...], "temperatures": [...],
        "package_version", "git_commit", "versions": {...}, "hosts": [...],
        "n_runs", "started_at", "ended_at", "statuses": {...}}``; values that differ
        between runs are listed, not hidden.
    """
    from relaxspec_audit.collect import logs

    table = runs_table(runs_dir, task)
    manifests = [logs.read_manifest(d) for d in table["run_dir"].to_list()]

    def distinct(values: Any) -> list[Any]:
        out = []
        for v in values:
            if v not in out:
                out.append(v)
        return out

    models = distinct(
        json.dumps(m.get("models", {}), sort_keys=True, default=str) for m in manifests
    )
    statuses: dict[str, int] = {}
    for m in manifests:
        statuses[str(m.get("status"))] = statuses.get(str(m.get("status")), 0) + 1
    commits = distinct(m.get("git_commit") for m in manifests)
    versions = distinct(json.dumps(m.get("versions", {}), sort_keys=True) for m in manifests)
    return _jsonable(
        {
            "n_runs": len(manifests),
            "models": [json.loads(x) for x in models],
            "seeds": distinct(m.get("config", {}).get("seed") for m in manifests),
            "k": distinct(m.get("config", {}).get("k") for m in manifests),
            "temperatures": distinct(m.get("config", {}).get("temperature") for m in manifests),
            "max_new_tokens": distinct(
                m.get("config", {}).get("max_new_tokens") for m in manifests
            ),
            "package_version": ", ".join(
                str(v) for v in distinct(m.get("package_version") for m in manifests)
            ),
            "git_commit": commits[0] if len(commits) == 1 else commits,
            "versions": [json.loads(x) for x in versions],
            "hosts": distinct(m.get("host") for m in manifests),
            "started_at": min((m.get("started_at") or "" for m in manifests), default=None),
            "ended_at": max((m.get("ended_at") or "" for m in manifests), default=None),
            "statuses": statuses,
        }
    )


def setting_key(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The setting a run measures: rule, resolved params, pair and sampling settings.

    Two runs with equal keys decode with one decoder (same rule and canonical params,
    ``registry.resolve_params``; same target and draft; same temperature, top-k, top-p,
    K and length), so their requests may be pooled; the split and seed are not part of
    it.
    """
    cfg = manifest.get("config") or {}
    rule = str(cfg.get("rule"))
    raw = cfg.get("params") or {}
    params = (
        registry.params_dict(registry.resolve_params(rule, raw)) if rule in registry.RULES else raw
    )
    key: dict[str, Any] = {"rule": rule, "params": params}
    for field in _SETTING_FIELDS:
        value = cfg.get(field)
        if field in ("target", "draft"):
            value = _model_identity(value)
        key[field] = float(value) if field == "temperature" and value is not None else value
    # A replica (noise floor at another batch size or dtype, coupling on another seed)
    # repeats its main run's items: pooled with it, those items would count twice.
    key["variant"] = cfg.get("variant")
    return key


def _model_identity(path: Any) -> Any:
    """A local model folder as its resolved path (a hub id as given).

    ``runs/../target`` and ``target/`` are one model; the raw strings would split them.
    (The manifest's ``config_sha256`` cannot serve: the config it hashes records the path.)
    """
    if path and Path(str(path)).exists():
        return str(Path(str(path)).resolve())
    return path


def _key_label(key: Mapping[str, Any]) -> str:
    """``nucleus θ=0.95`` plus the pair and sampling settings, for a refusal message."""
    label = (
        setting_label(key["rule"], key["params"]) if key["rule"] in registry.RULES else key["rule"]
    )
    rest = ", ".join(f"{f}={key[f]}" for f in _SETTING_FIELDS)
    return f"{label} ({rest})"


def check_one_setting(run_dirs: Any, what: str = "runs") -> dict[str, Any] | None:
    """Refuse a selection of runs that mixes settings (:func:`setting_key`).

    ``run_dirs`` are run folders or parents of run folders (``logs.find_runs``). Runs
    of one setting on several splits or seeds pass: they are one decoder's sample.

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
        groups.setdefault(blob, []).append(str(manifest.get("run_id") or Path(run_dir).name))
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


def split_note(
    runs_dir: str | Path, task: str, splits: tuple[str, ...] = ("discovery", "confirmation")
) -> str | None:
    """:data:`NO_SPLIT_NOTE` when no run of ``task`` carries the ``splits``, else None.

    Runs collected without ``--split`` have no discovery set to choose a setting on nor
    a disjoint confirmation set to judge it on (THEORY §3), so the fidelity, choice and
    sign-off pages show this instead of empty plots.
    """
    table = runs_table(runs_dir, task)
    have = {s for s in table["split"].to_list() if s is not None}
    return NO_SPLIT_NOTE if table.height and not have & set(splits) else None
