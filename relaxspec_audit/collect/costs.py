"""The cost table: seconds of one draft step, one verify pass and one target step.

The modelled speed-up (docs/STATISTICS.md §7, :mod:`relaxspec_audit.audit.speedup`)
multiplies integer counts from the logs (draft steps, verify passes, target steps per
request) by ONE table of per-step costs, so that two runs with identical logs get exactly
the same modelled time and machine load during a collection cannot move a comparison.
The table is measured once per (pair, device, dtype, K, batch size) by :func:`calibrate`,
stored under ``<runs>/costs/<id>.json`` and referenced by the run manifests
(``manifest["cost_table"]``).

What a table holds, per call at batch size ``B`` (the shapes the batched engine runs,
``collect/batched.py``):

- ``draft_step_s``: one ``[B, 1]`` draft forward (a round runs K of them; the first feeds
  one or two tokens, timed here as one);
- ``verify_s``: one ``[B, K + 1]`` target pass;
- ``target_step_s``: one ``[B, 1]`` target forward (target-only decoding, one per token).

Each is the MINIMUM over the timed repetitions after ``warmup`` untimed ones, the three
kinds interleaved rep by rep (the order rotated each rep) so that a load spike hits all
three alike. Other work on the machine only ever slows a call, so the fastest repetition is
the estimate a load is least able to move (a median measured 0.095 s and 0.685 s for one
key under load). Repetitions continue until, for every kind, the fastest quarter sits
within :data:`MAX_SPREAD` of the minimum (``spread = (q25 − min) / min``), or a cap is
reached. A table whose spread stays larger, or that was measured while the load average
reached the number of CPUs, carries :attr:`CostTable.warnings`; every number priced from
it says so (``audit``, ``summary.json``, the pages). Within a runs folder there is one
table per key (:func:`find_or_calibrate`), and two runs whose tables share a key are
priced with one of them (:func:`preferred`), so identical logs give exactly 1.0.

Not in the table: prefill, the rule's tensor code, host copies and logging (the same
per round whatever the costs; the wall clock of :mod:`relaxspec_audit.collect.timing`
includes them). The static-cache forward attends over its whole cache, so its cost depends
on the cache length: ``max_seq_len`` is recorded with the measurement.

Only the standard library at import time; torch inside :func:`calibrate`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Version of the stored JSON (``costs/<id>.json``, ``manifest["cost_table"]``). Schema 1
#: (medians, no spread check, ``measured`` outside the id) is still read, with a warning.
COST_TABLE_SCHEMA = 2

#: A kind's spread ``(q25 − min) / min`` at or below which its minimum is taken as settled.
MAX_SPREAD = 0.10

#: The per-step costs a table holds, in seconds (None: the pair has no such model).
COST_FIELDS = ("draft_step_s", "verify_s", "target_step_s")

#: The fields that say what was measured; two tables with the same key are interchangeable.
KEY_FIELDS = ("target", "draft", "device", "device_name", "dtype", "k", "batch_size")

#: Config entries that name where a model was loaded from, not what it is.
_VOLATILE_CONFIG = ("_name_or_path", "_commit_hash", "transformers_version", "torch_dtype",
                    "dtype")  # fmt: skip


class CostTableError(ValueError):
    """A cost table that cannot be read or used (its message names the field or file)."""


@dataclass(frozen=True)
class CostTable:
    """Per-step seconds of one (pair, device, dtype, K, batch size), and how they were measured.

    Attributes:
        target: the target model's identity (``model_type``, ``n_params``,
            ``config_sha256`` of its config without load paths; ``path`` for the reader).
        draft: the draft model's identity, or None when the pair has no draft.
        device: the torch device (``cpu``, ``cuda:0``).
        device_name: the CPU model or GPU name (a table from another machine is another key).
        dtype: the models' dtype (``float32``, ``bfloat16``).
        k: drafts per round K (the verify pass is ``K + 1`` tokens).
        batch_size: rows per call B.
        draft_step_s: seconds of one ``[B, 1]`` draft call (None without a draft).
        verify_s: seconds of one ``[B, K + 1]`` target call (None when K = 0).
        target_step_s: seconds of one ``[B, 1]`` target call.
        measured: how: ``reps``, ``warmup``, ``statistic`` (``min``), ``spread`` and
            ``iqr_s`` per kind, ``torch_threads``,
            ``cpu_count``, ``load_avg_before`` / ``load_avg_after``, ``engine``
            (the model adapter: ``static`` / ``transformers``; ``generic`` in tables of the
            one-request engine that came before), ``max_seq_len``, ``calibrated_at``,
            ``elapsed_s``.
        schema: the stored JSON's version (:data:`COST_TABLE_SCHEMA`; 1 for older tables).
    """

    target: Mapping[str, Any]
    draft: Mapping[str, Any] | None
    device: str
    device_name: str
    dtype: str
    k: int
    batch_size: int
    draft_step_s: float | None
    verify_s: float | None
    target_step_s: float
    measured: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    schema: int = field(default=COST_TABLE_SCHEMA, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("k", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CostTableError(f"cost table: field {name!r} must be an int >= 0, "
                                     f"got {value!r}")  # fmt: skip
        for name in COST_FIELDS:
            value = getattr(self, name)
            if value is None and name != "target_step_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise CostTableError(
                    f"cost table: field {name!r} must be a positive number of seconds, "
                    f"got {value!r}"
                )
            if value == float("inf"):
                raise CostTableError(f"cost table: field {name!r} is infinite")
            object.__setattr__(self, name, float(value))

    @property
    def warnings(self) -> tuple[str, ...]:
        """Why the table's costs may be wrong (empty: measured settled on a quiet machine)."""
        m = self.measured
        out = []
        if m.get("statistic") != "min" or not isinstance(m.get("spread"), Mapping):
            how = m.get("statistic") or "an unrecorded statistic"
            out.append(f"table {self.id} was measured without a spread check ({how} of "
                       "its reps)")  # fmt: skip
        else:
            wide = {k: v for k, v in m["spread"].items() if not v <= MAX_SPREAD}
            if wide:
                what = ", ".join(f"{k} {v:.2f}" for k, v in sorted(wide.items()))
                out.append(f"table {self.id}: spread stayed above {MAX_SPREAD:.2f} after "
                           f"{m.get('reps')} reps ({what})")  # fmt: skip
        load, cpus = m.get("load_avg_before"), m.get("cpu_count")
        if load and cpus and load[0] >= cpus:
            out.append(f"table {self.id} was calibrated on a loaded machine (load "
                       f"{load[0]:.2f} on {cpus} CPUs)")  # fmt: skip
        return tuple(out)

    @property
    def reliable(self) -> bool:
        """No :attr:`warnings`."""
        return not self.warnings

    def key(self) -> dict[str, Any]:
        """What was measured: identical keys mean interchangeable tables."""
        out = {name: getattr(self, name) for name in KEY_FIELDS}
        for role in ("target", "draft"):
            if out[role] is not None:  # identity only: the path is where, not what
                out[role] = {k: v for k, v in out[role].items() if k != "path"}
        return out

    @property
    def id(self) -> str:
        """Short sha256 (12 hex) of the key, the three values and how they were measured.

        ``measured`` is in it (schema 2), so an edited spread or load cannot pass as the
        calibration's; the load paths of the models are not.
        """
        blob: dict[str, Any] = {"key": self.key()}
        blob.update({name: getattr(self, name) for name in COST_FIELDS})
        if self.schema >= 2:
            blob["measured"] = dict(self.measured)
        text = json.dumps(blob, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (the stored file and ``manifest["cost_table"]``)."""
        out: dict[str, Any] = {"schema": self.schema, "id": self.id}
        for name in (*KEY_FIELDS, *COST_FIELDS):
            value = getattr(self, name)
            out[name] = dict(value) if isinstance(value, Mapping) else value
        out["measured"] = dict(self.measured)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostTable:
        """Inverse of :meth:`to_dict`; a stored ``id`` must match the recomputed one.

        Raises:
            CostTableError: a missing field, a bad value or an id that does not match.
        """
        if not isinstance(data, Mapping):
            raise CostTableError(f"cost table: expected a mapping, got {type(data).__name__}")
        missing = [n for n in (*KEY_FIELDS, *COST_FIELDS) if n not in data]
        if missing:
            raise CostTableError(f"cost table: missing field(s) {missing}")
        schema = data.get("schema", COST_TABLE_SCHEMA)
        if schema not in (1, COST_TABLE_SCHEMA):
            raise CostTableError(f"cost table: field 'schema' is {schema!r}; this version "
                                 f"reads 1 and {COST_TABLE_SCHEMA}")  # fmt: skip
        kwargs = {n: data[n] for n in (*KEY_FIELDS, *COST_FIELDS)}
        table = cls(**kwargs, measured=dict(data.get("measured") or {}), schema=schema)
        if data.get("id") is not None and data["id"] != table.id:
            raise CostTableError(
                f"cost table: field 'id' is {data['id']!r} but its contents hash to "
                f"{table.id!r} (edited or corrupted)"
            )
        return table

    def to_json(self) -> str:
        """Canonical JSON (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> CostTable:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))


# ----------------------------------------------------------------------------- storage


def costs_dir(runs_dir: str | Path) -> Path:
    """``<runs_dir>/costs``: where the tables of a runs folder live."""
    return Path(runs_dir) / "costs"


def save(table: CostTable, runs_dir: str | Path) -> Path:
    """Write ``<runs_dir>/costs/<id>.json`` atomically (temp file, fsync, rename)."""
    folder = costs_dir(runs_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table.id}.json"
    tmp = folder / f".{table.id}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(table.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(runs_dir: str | Path, table_id: str) -> CostTable:
    """The table ``<runs_dir>/costs/<table_id>.json``.

    Raises:
        CostTableError: no such file, or a file that does not parse (naming it).
    """
    path = costs_dir(runs_dir) / f"{table_id}.json"
    try:
        return CostTable.from_json(path.read_text())
    except OSError as exc:
        raise CostTableError(f"{path}: cannot read cost table ({exc.strerror})") from exc
    except (ValueError, TypeError) as exc:
        raise CostTableError(f"{path}: {exc}") from exc


def stored(runs_dir: str | Path) -> list[CostTable]:
    """Every readable table under ``<runs_dir>/costs`` (unreadable files are skipped)."""
    out = []
    for path in sorted(costs_dir(runs_dir).glob("*.json")):
        try:
            out.append(CostTable.from_json(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return out


def planned_batch_size(config: Any) -> int:
    """The rows per pass the batched engine will use (its automatic choice when None)."""
    import torch

    from relaxspec_audit.collect.batched import resolve_batch_size

    if config.batch_size is not None:
        return config.batch_size
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # The engine's own choice; the limit, when known, bounds the requests it will see.
    return resolve_batch_size(None, torch.device(device), config.limit or 2**62)


def flagged_note(warnings: Iterable[str]) -> str | None:
    """The note every number priced from flagged tables carries (None: none flagged)."""
    unique = list(dict.fromkeys(w for w in warnings if w))
    if not unique:
        return None
    return f"priced from a flagged cost table ({'; '.join(unique)}): it may be wrong"


def preferred(tables: Iterable[CostTable]) -> CostTable:
    """The one table of several calibrations of ONE key that prices them all.

    Reliable before flagged, then the smaller largest spread, then the earlier
    calibration, then the id: the choice depends on the tables, not on their order, so
    every path (``audit``, the notebooks, the batch) prices a pair of runs alike.

    Raises:
        ValueError: no tables, or tables of different keys.
    """
    tables = list(tables)
    if not tables:
        raise ValueError("preferred: no cost tables")
    if any(t.key() != tables[0].key() for t in tables[1:]):
        raise ValueError("preferred: tables of different keys measure different things")

    def rank(t: CostTable) -> tuple:
        spread = t.measured.get("spread")
        worst = max(spread.values()) if isinstance(spread, Mapping) and spread else math.inf
        return (not t.reliable, worst, str(t.measured.get("calibrated_at", "")), t.id)

    return min(tables, key=rank)


def one_per_key(tables: Iterable[CostTable | None]) -> dict[str, CostTable]:
    """Table id → the :func:`preferred` table of its key, over the tables given.

    What prices a set of runs audited together: two runs whose tables are two calibrations
    of one key are priced alike, so identical logs give exactly 1.0 [1, 1].
    """
    by_key: dict[str, list[CostTable]] = {}
    for t in tables:
        if t is not None:
            by_key.setdefault(json.dumps(t.key(), sort_keys=True, default=str), []).append(t)
    out = {}
    for same in by_key.values():
        chosen = preferred(same)
        out.update({t.id: chosen for t in same})
    return out


def find_or_calibrate(
    runs_dir: str | Path, pair: Any, k: int, batch_size: int, **calibrate_kw: Any
) -> CostTable:
    """The runs folder's table for this (pair, device, dtype, K, B), else a new one, saved.

    One table per key within a runs folder: a batch calibrates once and its resumed runs,
    and later collects into the same folder, reuse it, so their modelled times stay
    comparable. A folder that holds several (copied together from elsewhere) gives
    :func:`preferred`. To replace a flagged table, delete its file on a quiet machine:
    the runs keep theirs in their manifests, and pricing prefers the reliable one.
    """
    want = table_key(pair, k, batch_size)
    same = [t for t in stored(runs_dir) if t.key() == want]
    if same:
        return preferred(same)
    table = calibrate(pair, k, batch_size, **calibrate_kw)
    same = [t for t in stored(runs_dir) if t.key() == want]
    if same:  # another process calibrated meanwhile: keep the folder at one table per key
        return preferred(same)
    save(table, runs_dir)
    return table


# ----------------------------------------------------------------------------- identity


def model_identity(model: Any, path: str | None = None) -> dict[str, Any]:
    """What a model is (not where it was loaded from): type, size and config hash."""
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in _VOLATILE_CONFIG}
    return {
        "model_type": getattr(model.config, "model_type", None),
        "n_params": int(sum(t.numel() for t in model.parameters())),
        "config_sha256": hashlib.sha256(
            json.dumps(cfg, sort_keys=True, default=str).encode()
        ).hexdigest(),
        "path": path,
    }


def device_name(device: Any) -> str:
    """The GPU's name, or the CPU's model name (``platform.processor()`` as a fallback)."""
    import platform

    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def table_key(pair: Any, k: int, batch_size: int) -> dict[str, Any]:
    """The :meth:`CostTable.key` a calibration of ``pair`` at ``(k, batch_size)`` would have."""
    src = pair.info or {}

    def ident(model: Any, role: str) -> dict[str, Any] | None:
        if model is None:
            return None
        path = (src.get(role) or {}).get("path")
        return {k_: v for k_, v in model_identity(model, path).items() if k_ != "path"}

    return {
        "target": ident(pair.target, "target"),
        "draft": ident(pair.draft, "draft"),
        "device": str(pair.device),
        "device_name": device_name(pair.device),
        "dtype": str(pair.dtype).removeprefix("torch."),
        "k": int(k),
        "batch_size": int(batch_size),
    }


# ----------------------------------------------------------------------------- calibration


def calibrate(
    pair: Any,
    k: int,
    batch_size: int,
    *,
    max_reps: int = 60,
    warmup: int = 3,
    max_seconds: float | None = 10.0,
    min_reps: int = 8,
    max_spread: float = MAX_SPREAD,
    max_seq_len: int = 128,
) -> CostTable:
    """Measure one table: the three kinds of call interleaved rep by rep, until settled.

    Through the engine's own model adapter (``adapter.choose_adapter``): ``FastLM`` over a
    static cache of ``max_seq_len`` positions when the pair is Llama-family, else
    transformers' forward over one ``DynamicCache`` per row (cropped back before each call,
    as the engine rolls back). Every call runs at positions in the middle of the cache (a
    ``max_seq_len // 2``-token context is prefilled first). On CUDA each call is bracketed
    by ``torch.cuda.synchronize``. Each cost is the minimum of its reps (module docstring).

    Args:
        pair: a loaded :class:`~relaxspec_audit.collect.pair.Pair`.
        k: drafts per round K (0: target-only, no verify pass measured).
        batch_size: rows per call B.
        max_reps: at most this many timed repetitions of each kind.
        warmup: untimed repetitions first (allocator, kernels, caches).
        max_seconds: stop repeating after this much wall clock (None: up to ``max_reps``);
            a table stopped here with a spread above ``max_spread`` carries a warning.
        min_reps: repetitions before the spread is judged (and kept past ``max_seconds``).
        max_spread: stop once every kind's ``(q25 − min) / min`` is at most this.
        max_seq_len: the static cache's length (its attention spans all of it).

    Returns:
        The table (not saved: :func:`save`, or :func:`find_or_calibrate`).
    """
    import torch

    from relaxspec_audit.collect.adapter import choose_adapter

    checks = (("k", k, 0), ("batch_size", batch_size, 1), ("min_reps", min_reps, 2),
              ("max_reps", max_reps, max(min_reps, 2)), ("warmup", warmup, 0),
              ("max_seq_len", max_seq_len, 8))  # fmt: skip
    for name, value, low in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CostTableError(f"calibrate: {name} must be an int >= {low}, got {value!r}")
    if not 0 < max_spread < 1:
        raise CostTableError(f"calibrate: max_spread must be in (0, 1), got {max_spread!r}")
    if max_seq_len // 2 + k + 1 > max_seq_len:
        raise CostTableError(f"calibrate: max_seq_len {max_seq_len} leaves no room for a "
                             f"{k + 1}-token verify pass after its context")  # fmt: skip
    dev = pair.device
    load_before = _load_avg()
    adapter = choose_adapter(pair)
    calls = _calls(pair, adapter, k, batch_size, max_seq_len)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    kinds = list(calls)
    times: dict[str, list[float]] = {name: [] for name in kinds}
    t_start = time.perf_counter()
    done = 0
    with torch.inference_mode():
        for rep in range(warmup + max_reps):
            shift = rep % len(kinds)  # rotate the order: no kind always runs first
            for name in kinds[shift:] + kinds[:shift]:
                sync()
                t0 = time.perf_counter()
                calls[name]()
                sync()
                if rep >= warmup:
                    times[name].append(time.perf_counter() - t0)
            done = max(0, rep + 1 - warmup)
            if done < min_reps:
                continue
            if all(_spread(v) <= max_spread for v in times.values()):
                break
            if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
                break
    elapsed = time.perf_counter() - t_start
    src = pair.info or {}
    ident = table_key(pair, k, batch_size)
    for role in ("target", "draft"):
        if ident[role] is not None:
            ident[role] = {**ident[role], "path": (src.get(role) or {}).get("path")}
    measured = {
        "reps": done,
        "warmup": warmup,
        "statistic": "min",
        "spread": {name: _spread(v) for name, v in times.items()},
        "iqr_s": {name: _iqr(v) for name, v in times.items()},
        "engine": adapter.kind,
        "max_seq_len": max_seq_len,
        "context": max_seq_len // 2,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": _load_avg(),
        "torch": torch.__version__,
        "calibrated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_s": elapsed,
    }
    fastest = {name: min(v) for name, v in times.items()}
    return CostTable(
        **ident,
        draft_step_s=fastest.get("draft_step_s"),
        verify_s=fastest.get("verify_s"),
        target_step_s=fastest["target_step_s"],
        measured=measured,
    )


def _spread(values: list[float]) -> float:
    """``(q25 − min) / min``: how far the fastest quarter of the reps sits above the fastest."""
    import statistics

    if len(values) < 2:
        return math.inf
    low = min(values)
    q25 = statistics.quantiles(values, n=4, method="inclusive")[0]
    return (q25 - low) / low


def _iqr(values: list[float]) -> float:
    import statistics

    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _calls(pair: Any, adapter: Any, k: int, b: int, s_max: int) -> dict[str, Any]:
    """The three calls through the engine's model adapter, after a prefilled context.

    Every call runs at positions ``ctx ..`` of a ``ctx = s_max // 2`` context, so each sees
    the same length (the static cache overwrites the slots; transformers' caches are
    cropped back to the context before each call, as the engine rolls back).
    """
    import torch

    dev, ctx = pair.device, s_max // 2
    gen = torch.Generator().manual_seed(0)
    v = pair.vocab_size

    def ids(t: int) -> torch.Tensor:
        return torch.randint(0, v, (b, t), generator=gen).to(dev)  # [B, T]

    def pos(start: int, t: int, lm: Any) -> torch.Tensor:
        return (start + torch.arange(t)).expand(b, t).contiguous().to(lm.pos_device)  # [B, T]

    lms = {}
    with torch.inference_mode():
        for role, model in (("target", pair.target), ("draft", pair.draft if k else None)):
            if model is not None:
                lm = lms[role] = adapter.wrap(model)
                lm.setup_cache(b, s_max)
                lm(ids(ctx), pos(0, ctx, lm), keep=1)  # the context every timed call attends to

    def call(role: str, t: int, keep: int | None = None) -> Any:
        lm = lms[role]
        x, at = ids(t), pos(ctx, t, lm)
        # The engine reads logits as float over V columns; the argmax forces the whole call.
        return lambda: lm(x, at, keep=keep)[..., :v].float().argmax(-1)

    calls = {"target_step_s": call("target", 1)}
    if k:
        calls["verify_s"] = call("target", k + 1)
        if "draft" in lms:
            calls["draft_step_s"] = call("draft", 1, keep=1)
    return calls
