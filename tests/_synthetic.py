"""Synthetic log frames that follow schema v1 (docs/ARCHITECTURE.md, "Logs").

Numpy-vectorised so that the 10-million-row benchmark builds in seconds. The numbers are
not a language model's, but every column has its schema meaning and the invariants that
statistics rely on hold: ``passed_ratio == (u < min(1, p/q))``, ``accepted`` is a
contiguous prefix of the block, positions after the first rejection carry
``not_reached``, each round ends with one ``recovery`` or ``bonus`` row, and requests
have ``output_sha256`` of their ``output_ids`` (little-endian int32).

Other engineers may reuse :func:`make_run` and :func:`make_paired_requests`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

THETA_GRID = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


def sha256_ids(ids: np.ndarray) -> str:
    """sha256 of token ids as little-endian int32 bytes (docs/ARCHITECTURE.md "Logs")."""
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def make_run(
    n_requests: int = 40,
    rounds: int = 12,
    k: int = 4,
    *,
    rule: str = "exact",
    theta: float = 0.95,
    theta_grid: tuple[float, ...] = THETA_GRID,
    seed: int = 0,
    run_id: str = "run0",
    task: str = "synth",
    with_requests: bool = True,
    cluster_sd: float = 1.0,
) -> dict[str, pl.DataFrame]:
    """A synthetic run: ``{"positions", "rounds", "requests"}`` frames (schema v1 columns).

    Args:
        n_requests: requests (the clusters).
        rounds: target passes per request.
        k: drafts per block.
        rule: ``exact`` (accept iff the ratio test passes) or ``nucleus`` (also accept
            inside the θ nucleus, THEORY §2.3).
        theta: the run's θ (``in_nucleus`` and the nucleus rule).
        theta_grid: θ values of the ``es`` list column.
        seed: numpy seed.
        run_id: the ``run_id`` column.
        task: the ``task`` column of requests.
        with_requests: also build the requests table (skip for the big benchmark).
        cluster_sd: sd of the per-request random effect on the logit of acceptance, so
            observations within a request are correlated (clustered).
    """
    rng = np.random.default_rng(seed)
    n_rounds = n_requests * rounds
    # Per-request random effect makes positions of one request alike (clustering).
    effect = rng.normal(0.0, cluster_sd, n_requests).astype(np.float32)  # [R]
    req_of_round = np.repeat(np.arange(n_requests), rounds)  # [N_rounds]
    eff = effect[req_of_round][:, None]  # [N_rounds, 1]
    shape = (n_rounds, k)
    p = (1 / (1 + np.exp(-(rng.normal(0.3, 1.0, shape) + eff)))).astype(np.float32)  # [N, K]
    q = np.clip(p * rng.lognormal(0.2, 0.5, shape), 1e-4, 1.0).astype(np.float32)
    u = rng.random(shape, dtype=np.float32)
    passed = u < np.minimum(1.0, p / q)
    p_max = np.maximum(p, rng.uniform(p, 1.0)).astype(np.float32)
    # mass_above grows as p(x) falls; rank 1 iff nothing ranks above.
    mass_above = ((1 - p) * rng.beta(3.0, 1.0, shape)).astype(np.float32)
    top1 = rng.random(shape) < p
    mass_above = np.where(top1, 0.0, mass_above).astype(np.float32)
    rank = np.where(top1, 1, 1 + rng.geometric(0.25, shape)).astype(np.int64)
    entropy_p = rng.gamma(2.0, 0.5, shape).astype(np.float32)
    entropy_q = (entropy_p + rng.normal(-0.1, 0.3, shape)).clip(0).astype(np.float32)
    in_nucleus = mass_above < theta
    ok = passed | in_nucleus if rule == "nucleus" else passed
    accepted = np.cumprod(ok, axis=1).astype(bool)  # contiguous prefix
    n_acc = accepted.sum(axis=1)  # [N]
    reached = np.arange(k)[None, :] <= n_acc[:, None]
    grid = np.asarray(theta_grid, dtype=np.float32)
    # E_S grows with θ and is 0 outside the nucleus: a plausible per-θ profile.
    es_scale = (rng.random(shape) * 0.02).astype(np.float32)
    es = es_scale[..., None] * (mass_above[..., None] < grid) * grid  # [N, K, G]

    cause = np.where(
        ~reached,
        "not_reached",
        np.where(
            accepted,
            np.where(passed, "accept_ratio", "accept_nucleus"),
            "reject_ratio",
        ),
    )
    round_idx = np.tile(np.arange(rounds), n_requests)  # [N]
    req_ids = np.array([f"r{i:06d}" for i in range(n_requests)])
    request_id = req_ids[req_of_round]  # [N]
    # abs_pos: start of each round is the cumulative emitted count of the request.
    emitted = n_acc + 1
    start = np.cumsum(emitted.reshape(n_requests, rounds), axis=1) - emitted.reshape(
        n_requests, rounds
    )
    start = start.reshape(-1)  # [N]

    def flat(a: np.ndarray) -> np.ndarray:
        return a.reshape(-1)

    draft = pl.DataFrame(
        {
            "run_id": pl.Series([run_id]).extend_constant(run_id, n_rounds * k - 1),
            "request_id": np.repeat(request_id, k),
            "round": np.repeat(round_idx, k).astype(np.int32),
            "pos": np.tile(np.arange(k), n_rounds).astype(np.int32),
            "abs_pos": flat(start[:, None] + np.arange(k)).astype(np.int32),
            "kind": pl.Series(["draft"]).extend_constant("draft", n_rounds * k - 1),
            "token": flat(rng.integers(0, 1000, shape)),
            "target_argmax": flat(rng.integers(0, 1000, shape)),
            "rank": flat(rank),
            "p": flat(p),
            "q": flat(q),
            "p_max": flat(p_max),
            "mass_above": flat(mass_above),
            "entropy_p": flat(entropy_p),
            "entropy_q": flat(entropy_q),
            "tv_pq": flat(np.abs(p - q) / 2),
            "regret": flat(-np.log(p / p_max)),
            "u": flat(u),
            "passed_ratio": flat(passed),
            "in_nucleus": flat(in_nucleus),
            "accepted": flat(accepted),
            "cause": flat(cause),
            "es": pl.Series(es.reshape(-1, len(grid))).cast(pl.List(pl.Float32)),
        }
    )
    last_kind = np.where(n_acc == k, "bonus", "recovery")
    extra = pl.DataFrame(
        {
            "run_id": pl.Series([run_id]).extend_constant(run_id, n_rounds - 1),
            "request_id": request_id,
            "round": round_idx.astype(np.int32),
            "pos": n_acc.astype(np.int32),
            "abs_pos": (start + n_acc).astype(np.int32),
            "kind": last_kind,
            "token": rng.integers(0, 1000, n_rounds),
            "target_argmax": rng.integers(0, 1000, n_rounds),
            "rank": np.ones(n_rounds, dtype=np.int64),
            "p": rng.random(n_rounds, dtype=np.float32),
            "q": pl.Series(rng.random(n_rounds, dtype=np.float32)),
            "p_max": np.ones(n_rounds, dtype=np.float32),
            "mass_above": np.zeros(n_rounds, dtype=np.float32),
            "entropy_p": rng.gamma(2.0, 0.5, n_rounds).astype(np.float32),
            "entropy_q": rng.gamma(2.0, 0.5, n_rounds).astype(np.float32),
            "tv_pq": rng.random(n_rounds, dtype=np.float32) / 2,
            "regret": np.zeros(n_rounds, dtype=np.float32),
            "u": rng.random(n_rounds, dtype=np.float32),
            "passed_ratio": np.zeros(n_rounds, dtype=bool),
            "in_nucleus": np.ones(n_rounds, dtype=bool),
            "accepted": np.ones(n_rounds, dtype=bool),
            "cause": last_kind,
            "es": pl.Series(np.zeros((n_rounds, len(grid)), dtype=np.float32)).cast(
                pl.List(pl.Float32)
            ),
        }
    )
    # Bonus rows have no draft distribution (schema: q, entropy_q, tv_pq null for bonus).
    is_bonus = pl.col("kind") == "bonus"
    extra = extra.with_columns(
        pl.when(is_bonus).then(None).otherwise(pl.col(c)).alias(c)
        for c in ("q", "entropy_q", "tv_pq")
    )
    positions = pl.concat([draft, extra]).sort("request_id", "round", "pos")

    draft_s = rng.gamma(4.0, 0.0025, n_rounds) * k / 4
    verify_s = rng.gamma(4.0, 0.01, n_rounds)
    rounds_df = pl.DataFrame(
        {
            "run_id": [run_id] * n_rounds,
            "request_id": request_id,
            "round": round_idx.astype(np.int32),
            "start_pos": start.astype(np.int32),
            "k": np.full(n_rounds, k, dtype=np.int32),
            "accepted": n_acc.astype(np.int32),
            "emitted": emitted.astype(np.int32),
            "draft_s": draft_s,
            "verify_s": verify_s,
            "spent": pl.Series([None] * n_rounds, dtype=pl.Float64),
        }
    )
    out = {"positions": positions, "rounds": rounds_df}
    if with_requests:
        n_tok = emitted.reshape(n_requests, rounds).sum(axis=1)
        wall = (draft_s + verify_s).reshape(n_requests, rounds).sum(axis=1)
        outputs = [rng.integers(0, 1000, n).astype(np.int64) for n in n_tok]
        out["requests"] = pl.DataFrame(
            {
                "run_id": [run_id] * n_requests,
                "request_id": req_ids,
                "item_id": [f"item{i:05d}" for i in range(n_requests)],
                "task": [task] * n_requests,
                "split": ["discovery" if i % 2 == 0 else "confirmation" for i in range(n_requests)],
                "prompt_ids": [[1, 2, 3]] * n_requests,
                "output_ids": [o.tolist() for o in outputs],
                "output_sha256": [sha256_ids(o) for o in outputs],
                "text": [""] * n_requests,
                "n_tokens": n_tok.astype(np.int32),
                "stop": ["length"] * n_requests,
                "target_passes": np.full(n_requests, rounds, dtype=np.int32),
                "wall_s": wall,
                "score": (rng.random(n_requests) < 0.6).astype(np.float64),
            },
            schema_overrides={"prompt_ids": pl.List(pl.Int64), "output_ids": pl.List(pl.Int64)},
        )
    return out


def make_paired_requests(
    n_items: int = 200,
    *,
    delta: float = 0.0,
    base_rate: float = 0.6,
    samples: int = 1,
    item_sd: float = 1.0,
    diverge: float = 0.3,
    tasks: tuple[str, ...] = ("synth",),
    binary: bool = True,
    speedup: float = 1.5,
    seed: int = 0,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Reference and relaxed ``requests`` frames on the same items, with a known delta.

    Each item has a difficulty (logit random effect, sd ``item_sd``) so scores are
    correlated within an item and across the two arms (paired). The true mean delta
    (relaxed − reference, averaged over items with equal weight) is ``delta`` exactly for
    binary scores: the relaxed arm's success probability is the reference one shifted by
    ``delta`` per item (clipped to [0, 1] — keep ``base_rate`` away from the edges).

    Returns:
        ``(relaxed, reference)`` requests frames (schema v1 columns).
    """
    rng = np.random.default_rng(seed)
    n_tasks = len(tasks)
    logit = np.log(base_rate / (1 - base_rate)) + rng.normal(0, item_sd, (n_tasks, n_items))
    pr_ref = 1 / (1 + np.exp(-logit))  # [T, I]
    # Keep the shift exact: items too close to the edge get a reflected probability.
    pr_ref = np.clip(pr_ref, max(0.0, -delta) + 1e-3, min(1.0, 1 - delta) - 1e-3)
    pr_rel = pr_ref + delta
    frames = {"relaxed": [], "reference": []}
    for arm, pr, rate in (("relaxed", pr_rel, speedup), ("reference", pr_ref, 1.0)):
        rows = []
        for t, task in enumerate(tasks):
            for s in range(samples):
                # Shared uniform per (item, sample): a coupled draw makes the arms paired.
                u = np.random.default_rng([seed, t, s]).random(n_items)
                if binary:
                    score = (u < pr[t]).astype(np.float64)
                else:
                    score = pr[t] + 0.1 * (u - 0.5) + rng.normal(0, 0.05, n_items)
                n_tok = np.random.default_rng([seed, t, s, 7]).integers(20, 60, n_items)
                base = [
                    np.random.default_rng([seed, t, s, i]).integers(0, 1000, n)
                    for i, n in enumerate(n_tok)
                ]
                outs = []
                div = np.random.default_rng([seed, t, s, 9]).random(n_items) < diverge
                at = np.random.default_rng([seed, t, s, 11]).integers(0, 20, n_items)
                for i, o in enumerate(base):
                    o = o.copy()
                    if arm == "relaxed" and div[i]:
                        o[at[i]] = (o[at[i]] + 1) % 1000
                    outs.append(o)
                wall = n_tok * 0.02 / rate * rng.lognormal(0, 0.1, n_items)
                # Target passes: τ = 3 tokens per pass for the reference, ×rate for the
                # relaxed arm, with per-request noise (its own stream: other draws unchanged).
                jitter = np.random.default_rng([seed, t, s, 13]).lognormal(0, 0.05, n_items)
                passes = np.maximum(1, np.round(n_tok / (3 * rate) * jitter))
                rows.append(
                    pl.DataFrame(
                        {
                            "run_id": [f"{arm}{s}"] * n_items,
                            "request_id": [f"{task}-{i}-{s}" for i in range(n_items)],
                            "item_id": [f"{task}-{i}" for i in range(n_items)],
                            "task": [task] * n_items,
                            "split": [
                                "discovery" if i % 2 == 0 else "confirmation"
                                for i in range(n_items)
                            ],
                            "output_ids": [o.tolist() for o in outs],
                            "output_sha256": [sha256_ids(o) for o in outs],
                            "n_tokens": n_tok.astype(np.int32),
                            "target_passes": passes.astype(np.int32),
                            "wall_s": wall,
                            "score": score,
                        },
                        schema_overrides={"output_ids": pl.List(pl.Int64)},
                    )
                )
        frames[arm] = pl.concat(rows)
    return frames["relaxed"], frames["reference"]


def write_committed(run_dir, frames: dict[str, pl.DataFrame], manifest: dict) -> None:
    """Write synthetic frames as one committed chunk of writer ``w0`` (parts, then the record).

    The layout :class:`~relaxspec_audit.collect.writer.RunWriter` writes (a part per table,
    a commit record naming each part's rows and sha256), so verified reads accept it.
    """
    import json
    from pathlib import Path

    from relaxspec_audit.collect import logs

    run_dir = Path(run_dir)
    parts = {}
    for table in logs.TABLES:
        df = frames.get(table)
        if df is None or (table != "requests" and df.height == 0):
            parts[table] = None
            continue
        (run_dir / table).mkdir(parents=True, exist_ok=True)
        path = run_dir / table / "part-w0-00000.parquet"
        df.write_parquet(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        parts[table] = {"file": f"{table}/{path.name}", "rows": df.height, "sha256": digest}
    ids = frames["requests"]["request_id"].to_list() if "requests" in frames else []
    record = {"schema_version": logs.SCHEMA_VERSION, "writer": "w0", "chunk": 0,
              "request_ids": ids, "parts": parts}  # fmt: skip
    (run_dir / "commits").mkdir(parents=True, exist_ok=True)
    (run_dir / "commits" / "w0-00000.json").write_text(json.dumps(record))
    (run_dir / "manifest.json").write_text(json.dumps(manifest))


def cost_table(**fields) -> dict:
    """A complete cost-table dict (``CostTable.to_dict`` form) with test defaults.

    The ``id`` is recomputed from the fields, as a stored table's is.
    """
    from relaxspec_audit.collect.costs import CostTable

    data = {"target": {"model_type": "llama", "n_params": 1}, "draft": None, "device": "cpu",
            "device_name": "test", "dtype": "float32", "k": 4, "batch_size": 1,
            "draft_step_s": 0.001, "verify_s": 0.003, "target_step_s": 0.002,
            "measured": {"statistic": "min", "reps": 8,
                         "spread": {"draft_step_s": 0.0, "verify_s": 0.0,
                                    "target_step_s": 0.0}}}  # fmt: skip
    data.update({k: v for k, v in fields.items() if k != "id"})
    return CostTable.from_dict(data).to_dict()


def manifest(data: dict, where: str = "test/manifest.json"):
    """A manifest dict as the typed reader returns it (``RunManifest``); its cost table
    completed with :func:`cost_table`'s defaults when partial."""
    from relaxspec_audit.collect.manifest import RunManifest

    data = dict(data)
    if isinstance(data.get("cost_table"), dict):
        data["cost_table"] = cost_table(**data["cost_table"])
    return RunManifest.from_dict(data, where)


def speed_facts(**fields):
    """A ``SpeedFacts`` record with test defaults (nothing known)."""
    from relaxspec_audit.audit.records import SpeedFacts

    data = {"modelled": {"speedup": None, "ci_low": None, "ci_high": None, "basis": None,
                         "note": None},
            "vs_target": None, "reference_vs_target": None, "wall_clock": None,
            "sentence": "", "split": "confirmation"}  # fmt: skip
    data.update(fields)
    return SpeedFacts.model_validate(data)


def family_verdict(**fields):
    """A ``FamilyVerdict`` record with test defaults: no rows, no evidence."""
    from relaxspec_audit.audit.results import FamilyVerdict

    data = {"rule": "nucleus", "reference": "exact", "knob": "theta", "verdict": "INCONCLUSIVE",
            "chosen": None, "setting": None, "shown_setting": None, "discovery": None,
            "confirmation": None, "frontier": [], "speed": speed_facts(), "noise_floor": None,
            "attribution": None, "loglik": None, "coupling": None, "reasons": [],
            "caveats": [], "n_required": None, "select": None, "headline": "test."}  # fmt: skip
    data.update(fields)
    return FamilyVerdict.model_validate(data)


def manifest_facts(**fields):
    """A ``ManifestFacts`` record with test defaults."""
    from relaxspec_audit.audit.results import ManifestFacts

    data = {"n_runs": 0, "models": [], "seeds": [], "k": [], "temperatures": [],
            "max_new_tokens": [], "package_version": "0", "git_commit": None, "versions": [],
            "hosts": [], "started_at": None, "ended_at": None, "statuses": {}}  # fmt: skip
    data.update(fields)
    return ManifestFacts.model_validate(data)


def task_audit(**fields):
    """A ``TaskAudit`` record with test defaults (one task, no family)."""
    from relaxspec_audit.audit.results import TaskAudit

    data = {"batch": None, "task": "t", "task_slug": "t", "generated_at": "2026-01-01T00:00:00",
            "package_version": "0", "status": "ok", "ni_margin": 0.02, "alpha": 0.05,
            "min_gain": 1.0, "families": [],
            "rejection_anatomy": {"rule": "exact", "alpha": 0.05, "runs": [], "note": None},
            "manifest": manifest_facts(), "n_runs": 0}  # fmt: skip
    data.update(fields)
    return TaskAudit.model_validate(data)


def setting_row(**fields):
    """A ``SettingRow`` record with test defaults: every number unknown."""
    from relaxspec_audit.audit.records import SettingRow

    data = {name: None for name in SettingRow.model_fields}
    data.update(rule="nucleus", reference="exact", setting="nucleus θ=0.95",
                is_reference=False, params='{"theta": 0.95}')  # fmt: skip
    data.update(fields)
    return SettingRow.model_validate(data)


def frontier_row(**fields):
    """A ``FrontierRow`` record with test defaults (θ = 0.95, nothing known)."""
    from relaxspec_audit.audit.records import FrontierRow

    data = {name: None for name in FrontierRow.model_fields if name != "setting"}
    data.update(setting={"theta": 0.95}, noninferior=False)
    data.update(fields)
    return FrontierRow.model_validate(data)


def verdict(**fields):
    """A ``Verdict`` record with test defaults (INCONCLUSIVE, nothing chosen)."""
    from relaxspec_audit.audit.records import Verdict

    numbers = {"ni_margin": 0.02, "alpha": 0.05, "power": 0.8, "min_gain": 1.0, "eps_cap": None}
    numbers.update(fields.pop("numbers", {}))
    data = {"status": "INCONCLUSIVE", "setting": None, "reasons": [], "numbers": numbers}
    data.update(fields)
    return Verdict.model_validate(data)
