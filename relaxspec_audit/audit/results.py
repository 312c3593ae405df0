"""The audit's typed results: the verdict per rule family and the task audit around it.

The records a verdict is made of (the base :class:`~.records.Record`, audit rows, the
verdict, the evidence blocks) live in :mod:`relaxspec_audit.audit.records`.

These frozen records are what :mod:`relaxspec_audit.audit` decides and what the report
stage renders; their JSON serialisation *is* the versioned ``summary.json`` schema
(docs/REPORTS.md), as inspect_ai's ``EvalLog`` is its log format. The report reads a
:class:`TaskAudit` (computed, or read back with :meth:`TaskAudit.read`) and never a log.

Every record validates on construction and on read (``extra="forbid"``: a field the
schema does not know is an error, so a renamed key cannot pass silently). Non-finite
floats are stored as ``null``; a rule parameter that is infinite (an uncapped ASD ``cap``)
is written as the string ``"inf"`` and read back as ``math.inf``.

Field order is the JSON key order: **do not rename, retype or remove a field without
bumping** :data:`SUMMARY_SCHEMA_VERSION` (adding an optional field is compatible).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_serializer

from relaxspec_audit.audit.records import (
    Attribution,
    Coupling,
    Failed,
    Loglik,
    NoiseFloor,
    Params,
    Record,
    SettingRow,
    SpeedFacts,
    Status,
    Verdict,
    _params_out,
)

#: Name and version of the ``summary.json`` schema (docs/REPORTS.md).
SUMMARY_SCHEMA = "relaxspec_audit.summary"
#: 4: the typed records of this module (read back validated); ``headline`` per family.
SUMMARY_SCHEMA_VERSION = 4

# ------------------------------------------------------------------------ the family, the task


class FamilyVerdict(Record):
    """One relaxed rule of a task: its verdict, the setting chosen, and the evidence.

    ``divergence_html`` (the explorer page of a batch) is left out of the JSON when the
    audit was computed outside a batch.
    """

    _omit_none = ("divergence_html",)
    _params_fields = ("chosen",)

    rule: str
    reference: str
    knob: str | None
    verdict: Status
    chosen: Params | None
    setting: str | None
    shown_setting: str | None
    discovery: SettingRow | None
    confirmation: SettingRow | None
    frontier: list[SettingRow]
    speed: SpeedFacts
    noise_floor: NoiseFloor | Failed | None
    attribution: Attribution | Failed | None
    loglik: Loglik | Failed | None
    coupling: Coupling | Failed | None
    reasons: list[str]
    caveats: list[str]
    n_required: int | None
    select: Verdict | None
    headline: str
    divergence_html: str | None = None

    @field_serializer("chosen")
    def _chosen_out(self, value: Params | None) -> Any:
        return _params_out(value)

    @property
    def params(self) -> Any:
        """The chosen setting as the rule's typed params (None: nothing chosen)."""
        from relaxspec_audit.verify.registry import resolve_params

        return None if self.chosen is None else resolve_params(self.rule, self.chosen)


class MeanCI(Record):
    """A clustered mean with its interval."""

    mean: float | None
    ci_low: float | None
    ci_high: float | None


class Entropies(Record):
    """Target and draft entropies (nats) and their gap H(q) − H(p) at a set of positions."""

    entropy_p: MeanCI
    entropy_q: MeanCI
    gap: MeanCI
    n_positions: int | None


class NucleusShare(Record):
    """The share of rejected drafts inside the θ nucleus (``mass_above < θ``)."""

    theta: float
    fraction: float | None
    ci_low: float | None
    ci_high: float | None


class TopkShare(Record):
    """The share of rejected drafts in the target's top k."""

    k: int
    fraction: float | None
    ci_low: float | None
    ci_high: float | None


class ExtraAcceptance(Record):
    """Entropies where a relaxed run accepted what the ratio test rejected."""

    _omit_none = ("entropy_p", "entropy_q", "gap", "note")

    rule: str
    setting: str
    run_id: str | None
    entropy_p: MeanCI | None = None
    entropy_q: MeanCI | None = None
    gap: MeanCI | None = None
    n_positions: int | None
    note: str | None = None


class AnatomyRun(Record):
    """One sampled ``exact`` run's rejection anatomy (THEORY §3)."""

    split: str | None
    run_id: str | None
    temperature: float | None
    n_requests: int
    n_rejections: int
    n_requests_with_rejections: int
    in_nucleus: list[NucleusShare]
    topk: list[TopkShare]
    entropy_at_rejections: Entropies
    extra_acceptances: list[ExtraAcceptance]
    note: str | None


class AnatomyBlock(Record):
    """Where the ratio test's rejected drafts lie, per sampled reference run."""

    _omit_none = ("error",)

    rule: str
    alpha: float
    runs: list[AnatomyRun]
    note: str | None
    error: str | None = None


class ManifestFacts(Record):
    """How the runs were made, from their manifests; values that differ are all listed."""

    n_runs: int
    models: list[dict[str, Any]]
    seeds: list[int | None]
    k: list[int | None]
    temperatures: list[float | None]
    max_new_tokens: list[int | None]
    package_version: str
    git_commit: str | list[str | None] | None
    versions: list[dict[str, Any]]
    hosts: list[str | None]
    started_at: str | None
    ended_at: str | None
    statuses: dict[str, int]
    #: Why the cost tables that price the task's runs may be wrong (empty: none flagged).
    cost_warnings: list[str] = Field(default_factory=list)


class NotebookEntry(Record):
    """A rendered report notebook: its page, or the error it stopped on."""

    name: str
    ok: bool
    html: str | None
    error: str | None
    seconds: float | None = None


class TaskAudit(Record):
    """A task's audit: the ``summary.json`` a task is signed off on (docs/REPORTS.md)."""

    schema_: Literal["relaxspec_audit.summary"] = Field(SUMMARY_SCHEMA, alias="schema")
    schema_version: Literal[4] = SUMMARY_SCHEMA_VERSION
    batch: str | None
    task: str
    task_slug: str
    generated_at: str
    package_version: str
    status: Literal["ok", "failed"]
    ni_margin: float
    alpha: float
    min_gain: float
    families: list[FamilyVerdict]
    rejection_anatomy: AnatomyBlock
    manifest: ManifestFacts | None
    n_runs: int | None
    notebooks: list[NotebookEntry] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    def to_json(self) -> str:
        """``summary.json``'s text: indented, keys in schema order, no NaN."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def write(self, path: str | Path) -> Path:
        """Write ``summary.json`` atomically (a reader sees the old file or the new one)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        try:
            tmp.write_text(self.to_json())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    @classmethod
    def read(cls, path: str | Path) -> TaskAudit:
        """Read and validate a ``summary.json``.

        Raises:
            ValueError: not JSON, another schema or version, or a field that does not
                validate, naming the file and the field's path.
        """
        from pydantic import ValidationError

        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable summary.json ({exc})") from exc
        if not isinstance(data, Mapping) or data.get("schema") != SUMMARY_SCHEMA:
            raise ValueError(f"{path}: not a {SUMMARY_SCHEMA} file")
        if data.get("schema_version") != SUMMARY_SCHEMA_VERSION:
            raise ValueError(
                f"{path}: schema_version {data.get('schema_version')!r}, this code reads "
                f"{SUMMARY_SCHEMA_VERSION}; audit the runs again"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{path}: {where}: {first['msg']}") from exc

    def family(self, rule: str) -> FamilyVerdict | None:
        """The family of ``rule`` (None: the task has none)."""
        return next((f for f in self.families if f.rule == rule), None)
