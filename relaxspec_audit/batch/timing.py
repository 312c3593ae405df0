"""The batch's paired timing pass: wall clock measured so that machine load hits both sides.

Collection runs are decoded one after the other, so their wall clocks carry whatever else
the machine did meanwhile. When a task asks for ``timing: {items, repeats}``, this step
re-decodes a sample of its discovery items under each family's configs — the lossless
reference, every relaxed setting judged against it, and target-only decoding — in one
process, alternating config by config in a balanced order
(:func:`~relaxspec_audit.collect.timing.timing_pass`), and stores the record under
``<runs>/timing/<id>.json``. The reports read it back as the labelled wall clock
(:func:`relaxspec_audit.audit.speed_facts.timing_for`); it never decides a verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relaxspec_audit.batch.plan import TaskPlan
from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig
from relaxspec_audit.verify.registry import RULES


def families(runs: list[RunConfig], split: str = "discovery") -> list[list[RunConfig]]:
    """Per lossless reference of ``split``: ``[reference, *relaxed settings, target-only]``.

    A relaxed run joins the reference its rule is judged against (the registry's
    ``reference_for`` at its temperature) with the same seed and sampling; the target-only
    run of the split closes each family as the speed baseline.
    """
    main = [r for r in runs if r.split == split]
    target = next((r for r in main if r.rule == TARGET_ONLY), None)
    out = []
    for ref in main:
        spec = RULES.get(ref.rule)
        if spec is None or not spec.lossless:
            continue
        rel = [
            r
            for r in main
            if r.rule in RULES
            and not RULES[r.rule].lossless
            and RULES[r.rule].reference_for(r.temperature) == ref.rule
            and (r.seed, r.temperature, r.k) == (ref.seed, ref.temperature, ref.k)
        ]
        if rel:
            out.append([ref, *rel, *([target] if target is not None else [])])
    return out


def _stored(runs_dir: Path, run_ids: list[str], items: list[str], repeats: int) -> Path | None:
    """A stored timing record of exactly these runs, items and repeats (a resumed batch)."""
    folder = runs_dir / "timing"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (rec.get("run_ids"), rec.get("items"), rec.get("repeats")) == (
            run_ids, items, repeats,
        ):  # fmt: skip
            return path
    return None


def time_task(task: TaskPlan, runs_dir: str | Path) -> list[Path]:
    """Run the task's paired timing pass for every family; return the record paths.

    Nothing happens without ``task.timing``. The sample is the first ``items`` discovery
    items (task order, the same in every family); ``repeats`` is rounded up to whole
    cycles of the family's configs; a record of the same runs, items and repeats already
    stored is reused.
    """
    from relaxspec_audit import tasks
    from relaxspec_audit.batch.pairs import cached_pair
    from relaxspec_audit.collect.pair import encode_prompt
    from relaxspec_audit.collect.stops import StopStrings
    from relaxspec_audit.collect.timing import save_timing, timing_pass

    if not task.timing:
        return []
    runs_dir = Path(runs_dir)
    n_items, repeats = int(task.timing["items"]), int(task.timing["repeats"])
    paths = []
    for fam in families(list(task.runs)):
        ref = fam[0]
        limit = min(n_items, ref.limit or n_items)
        loaded = tasks.load_task(ref.task, split=ref.split, limit=limit)
        items = loaded.items[:n_items]
        run_ids = [c.run_id() for c in fam]
        # Whole Latin-square cycles: each config sits at every position equally often, so
        # a drift linear in time cancels from every log ratio (timing.balanced_order).
        reps = -(-repeats // len(fam)) * len(fam)
        have = _stored(runs_dir, run_ids, [it.id for it in items], reps)
        if have is not None:
            paths.append(have)
            continue
        draft = next((c.draft for c in fam if c.rule != TARGET_ONLY), None)
        pair = cached_pair(ref.target, draft, ref.device, ref.dtype)
        requests = [(it.id, encode_prompt(pair, it.prompt)) for it in items]
        stops = StopStrings(pair.tokenizer, loaded.stop) if loaded.stop else None
        result: dict[str, Any] = timing_pass(
            pair, fam, requests, repeats=reps, batch_size=ref.batch_size, stops=stops
        )
        paths.append(save_timing(result, runs_dir))
    return paths
