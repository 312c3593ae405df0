"""A run's manifest, typed: read once, its rule parameters resolved, used by every reader.

``manifest.json`` is the record a run is reproduced from (docs/ARCHITECTURE.md "Logs"):
the :class:`~relaxspec_audit.collect.config.RunConfig` that made it, the pair, the engine,
the cost table, versions, times and status. Writers compose it as a mapping;
:func:`~relaxspec_audit.collect.reader.read_manifest` turns what is on disk into a
:class:`RunManifest` — the config rebuilt (so its rule parameters are resolved by the
registry, defaults filled in) and the cost table parsed — and every reader (audit, report,
batch, CLI) works from that object instead of re-deriving fields from the raw dict.

Only the standard library and the light collect modules are imported: no torch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relaxspec_audit.collect.config import ConfigError, RunConfig, task_slug
from relaxspec_audit.collect.costs import CostTable, CostTableError, one_per_key
from relaxspec_audit.collect.schema import LogError
from relaxspec_audit.verify import registry

#: The statuses a writer sets (``RunWriter``): decoding, done, or stopped.
STATUSES = ("running", "complete", "failed", "interrupted")


@dataclass(frozen=True, eq=False)
class RunManifest(Mapping[str, Any]):
    """One run's manifest as read from its folder.

    It is the written record (a read-only mapping: ``manifest["engine"]``) with the
    fields every reader needs typed and derived once (``config``, ``cost_table``,
    ``pass_cost``, ``label``, …); package code uses the attributes. Two manifests are equal
    when their records are, wherever they were read from.

    Attributes:
        where: the run folder it was read from (a local path or an object-store URL).
        run_id: the run's id (``RunConfig.run_id()`` when the run was made).
        config: the run configuration, rebuilt and resolved (``config.params`` is the
            rule's typed params object; None for target-only decoding).
        status: ``running``, ``complete``, ``failed`` or ``interrupted`` (None: unset).
        n_requests: requests committed so far (None: unset).
        cost_table: the cost table that prices its passes (None: not calibrated).
        record: the whole manifest as written, read-only (``engine``, ``models``,
            ``inputs``, ``versions``, ``git_commit``, ``host``, times, …).
    """

    where: str
    run_id: str | None
    config: RunConfig
    status: str | None
    n_requests: int | None
    cost_table: CostTable | None
    record: Mapping[str, Any]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "manifest") -> RunManifest:
        """Parse a manifest mapping.

        Raises:
            LogError: a field that is missing or does not parse, naming ``where`` and the
                field (``…/manifest.json: config.params: theta: must be in (0, 1]``).
        """
        if not isinstance(data, Mapping):
            raise LogError(f"{where}: a manifest is a JSON object, got {type(data).__name__}")
        cfg = data.get("config")
        if not isinstance(cfg, Mapping):
            raise LogError(f"{where}: field 'config' is missing or not an object")
        try:
            config = RunConfig.from_dict(dict(cfg))
        except ConfigError as exc:
            raise LogError(f"{where}: config.{exc.field}: {exc.message}") from exc
        except TypeError as exc:  # a field of the wrong shape (e.g. theta_grid: 5)
            raise LogError(f"{where}: config: {exc}") from exc
        run_id = data.get("run_id")
        if run_id is not None and not isinstance(run_id, str):
            raise LogError(f"{where}: field 'run_id' must be a string, got {run_id!r}")
        status = data.get("status")
        if status is not None and status not in STATUSES:
            raise LogError(f"{where}: field 'status' must be one of {STATUSES}, got {status!r}")
        n = data.get("n_requests")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise LogError(f"{where}: field 'n_requests' must be an integer >= 0, got {n!r}")
        table = data.get("cost_table")
        try:
            cost_table = CostTable.from_dict(table) if table is not None else None
        except CostTableError as exc:
            raise LogError(f"{where}: field 'cost_table': {exc}") from exc
        record = types.MappingProxyType(copy.deepcopy(dict(data)))  # read-only at the top
        return cls(str(where), run_id, config, status, n, cost_table, record)

    def priced_with(self, table: CostTable) -> RunManifest:
        """This manifest with ``table`` pricing its passes (another calibration of its key).

        The record keeps the run's own table; only :attr:`cost_table` (and so
        :attr:`pass_cost`) changes. See :func:`~relaxspec_audit.collect.costs.one_per_key`.

        Raises:
            ValueError: the run has no table, or ``table`` measured another key.
        """
        own = self.cost_table
        if own is None or own.key() != table.key():
            raise ValueError(f"run {self.run_id}: cost table {table.id} does not measure "
                             "what the run's own table measures")  # fmt: skip
        return dataclasses.replace(self, cost_table=table)

    @property
    def own_cost_table(self) -> CostTable | None:
        """The table the run was collected with (:attr:`cost_table` may be a shared one)."""
        table = self.record.get("cost_table")
        return CostTable.from_dict(table) if table is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The manifest as written (a fresh, mutable copy)."""
        return copy.deepcopy(dict(self.record))

    def __getitem__(self, key: str) -> Any:
        return self.record[key]

    def __iter__(self) -> Any:
        return iter(self.record)

    def __len__(self) -> int:
        return len(self.record)

    # ------------------------------------------------------------------ recorded, as is

    @property
    def engine(self) -> Mapping[str, Any]:
        """The engine that decoded it (``engine``, ``batch_size``, …; empty: unknown)."""
        return self.record.get("engine") or {}

    @property
    def models(self) -> Mapping[str, Any]:
        """The pair as loaded: ``target`` / ``draft`` / ``tokenizer`` identities, device."""
        return self.record.get("models") or {}

    @property
    def inputs(self) -> Mapping[str, Any]:
        """The hashes of the model files and of the task the run is bound to."""
        return self.record.get("inputs") or {}

    @property
    def versions(self) -> Mapping[str, Any]:
        """torch, transformers, polars, … versions of the writer."""
        return self.record.get("versions") or {}

    @property
    def package_version(self) -> str | None:
        """relaxspec_audit's version when the run was written."""
        return self.record.get("package_version")

    @property
    def git_commit(self) -> str | None:
        """The repository commit the writer ran from (None outside a checkout)."""
        return self.record.get("git_commit")

    @property
    def host(self) -> str | None:
        """The writer's host name."""
        return self.record.get("host")

    @property
    def started_at(self) -> str | None:
        """When the run started (ISO 8601, UTC)."""
        return self.record.get("started_at")

    @property
    def ended_at(self) -> str | None:
        """When the run ended (None while it runs)."""
        return self.record.get("ended_at")

    # ------------------------------------------------------------------ derived, once

    @property
    def rule(self) -> str:
        """The rule name (or the target-only pseudo-rule)."""
        return self.config.rule

    @property
    def spec(self) -> registry.RuleSpec | None:
        """The rule's registry entry (None for target-only decoding)."""
        return self.config.spec

    @property
    def params(self) -> Any:
        """The rule's resolved, typed params (None for target-only decoding)."""
        return self.config.params

    @property
    def label(self) -> str:
        """The setting's label (``nucleus θ=0.9``), from the registry."""
        return registry.setting_label(self.rule, self.params) if self.spec else self.rule

    @property
    def task_slug(self) -> str:
        """The task's hive key (its name, or a task file's stem)."""
        return task_slug(self.config.task)

    @property
    def variant(self) -> str | None:
        """A replica's label (noise floor, coupling), None for a main run."""
        return self.config.variant

    @property
    def pass_cost(self) -> float | None:
        """Modelled seconds of one target pass, from the cost table (docs/STATISTICS.md §7).

        A speculative round is K draft steps and one verify pass of K + 1 tokens; a
        target-only token is one target step. None without a cost table.

        Raises:
            ValueError: the table was calibrated at another K (its verify pass prices
                another number of tokens), naming both.
        """
        table = self.cost_table
        if table is None:
            return None
        if self.spec is None:
            return table.target_step_s
        k = self.config.k
        if table.k != k:
            raise ValueError(
                f"config.k: run {self.run_id} drafts K = {k} but its cost table "
                f"{table.id} was calibrated at cost_table.k = {table.k}"
            )
        if table.draft_step_s is None or table.verify_s is None:
            return None
        return k * table.draft_step_s + table.verify_s

    @property
    def theta_grid(self) -> tuple[float, ...]:
        """The θ grid the run logged ``es`` on."""
        return self.config.theta_grid

    @property
    def nucleus_theta(self) -> float | None:
        """The run's nucleus θ where NSD's deviation accounting applies, else None."""
        spec = self.spec
        if spec is None or registry.NSD_DEVIATION not in spec.measures:
            return None
        theta = spec.nucleus_theta(self.params)
        return theta if math.isfinite(theta) else None


def priced_alike(manifests: Sequence[RunManifest]) -> list[RunManifest]:
    """The manifests with each table replaced by the one that prices its key for all.

    Runs audited together whose tables are two calibrations of one key (two runs folders,
    a recalibration) are priced with one of them
    (:func:`~relaxspec_audit.collect.costs.one_per_key`): a load during either calibration
    cannot move their comparison, and identical logs give exactly 1.0.
    """
    chosen = one_per_key(m.cost_table for m in manifests)
    out = []
    for m in manifests:
        table = chosen.get(m.cost_table.id) if m.cost_table is not None else None
        out.append(m if table is None or table.id == m.cost_table.id else m.priced_with(table))
    return out
