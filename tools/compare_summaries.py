"""Compare two batches' ``summary.json`` files: the same verdicts and decided numbers?

A refactor must not move what a batch decides. Run the same batch (same config, same seed)
on two commits and point this at the two report folders:

    python tools/compare_summaries.py reports-before/demo reports-after/demo

For every task and rule family it compares the verdict, the chosen setting, the items
needed, and every number the verdict and its evidence are decided on: the frontier and
confirmation rows (accuracy deltas and their tests, divergence, τ, deviation), the
planning value, the noise floor, the attribution counts, the likelihood and coupling
estimates and the rejection anatomy. Exempt, because they are measured on the clock:
wall-clock speed-ups, and everything priced by a cost table (the modelled speed-ups
over the reference and over target-only decoding: a table is a fresh timing calibration
in each batch) — the verdicts they decide are still compared. Sentences (reasons,
headlines) are listed when they differ but do not fail the comparison.

Exit status 0 when every decided value agrees (floats to ``--rtol``), 1 otherwise, 2 on
unreadable input. Works across summary schema versions 3 and 4 (the fields compared are
the same in both).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: Keys whose values are measured on the clock (or priced by a clock-measured table).
TIMED = {
    "wall_speedup", "wall_ci_low", "wall_ci_high", "wall_speedup_vs_reference",
    "wall_speedup_vs_baseline", "wall_clock", "speedup", "speedup_ci_low", "speedup_ci_high",
    "speedup_vs_reference", "speedup_vs_baseline", "baseline_ci_low", "baseline_ci_high",
    "modelled", "vs_target", "reference_vs_target", "speed_note", "seconds",
    "kv_cache_bytes",
}  # fmt: skip
#: Keys that hold words, reported but not decided on.
WORDS = {"reasons", "headline", "sentence", "note", "label", "caveats"}
#: Top-level keys that describe the run, not the verdict.
META = {"generated_at", "package_version", "manifest", "notebooks", "schema_version"}


def _close(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol)
    return a == b


def compare(old: Any, new: Any, path: str, rtol: float, out: dict[str, list[str]]) -> None:
    """Walk two JSON values; record decided, worded and timed differences by path."""
    key = path.rsplit(".", 1)[-1].split("[")[0]
    if key in TIMED:
        if old != new:
            out["timed"].append(path)
        return
    if key in WORDS:
        if old != new:
            out["words"].append(f"{path}:\n    - {old!r}\n    + {new!r}")
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k in old and k in new:
                compare(old[k], new[k], f"{path}.{k}", rtol, out)
            elif k not in TIMED | WORDS:
                # A field only one side has: new in v4 (headline) or dropped.
                (out["added"] if k in new else out["decided"]).append(f"{path}.{k}")
        return
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            out["decided"].append(f"{path}: {len(old)} items vs {len(new)}")
            return
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            compare(a, b, f"{path}[{i}]", rtol, out)
        return
    if not _close(old, new, rtol):
        out["decided"].append(f"{path}: {old!r} → {new!r}")


def compare_folders(before: Path, after: Path, rtol: float = 1e-9) -> dict[str, list[str]]:
    """Differences between the ``*/summary.json`` files of two report folders."""
    out: dict[str, list[str]] = {"decided": [], "added": [], "timed": [], "words": []}
    old_tasks = {p.parent.name: p for p in sorted(before.glob("*/summary.json"))}
    new_tasks = {p.parent.name: p for p in sorted(after.glob("*/summary.json"))}
    if not old_tasks:
        raise FileNotFoundError(f"{before}: no */summary.json")
    for task in sorted(set(old_tasks) | set(new_tasks)):
        if task not in old_tasks or task not in new_tasks:
            out["decided"].append(f"{task}: only in {'after' if task in new_tasks else 'before'}")
            continue
        old = json.loads(old_tasks[task].read_text())
        new = json.loads(new_tasks[task].read_text())
        for k in META:
            old.pop(k, None)
            new.pop(k, None)
        # Families by rule: the order is the audit table's, but say so if it moved.
        old_f = {f["rule"]: f for f in old.pop("families", [])}
        new_f = {f["rule"]: f for f in new.pop("families", [])}
        compare(old, new, task, rtol, out)
        compare(old_f, new_f, f"{task}.families", rtol, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="report folder of the first batch")
    parser.add_argument("after", type=Path, help="report folder of the second batch")
    parser.add_argument("--rtol", type=float, default=1e-9, help="relative float tolerance")
    args = parser.parse_args(argv)
    try:
        out = compare_folders(args.before, args.after, args.rtol)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for kind, title in (("timed", "measured on the clock (exempt)"),
                        ("added", "fields only the second batch has"),
                        ("words", "sentences that differ (not decided on)"),
                        ("decided", "DECIDED VALUES THAT DIFFER")):  # fmt: skip
        if out[kind]:
            print(f"{title}: {len(out[kind])}")
            for line in out[kind][:200]:
                print(f"  {line}")
    same = not out["decided"]
    print("same verdicts and decided numbers" if same else "the batches decide differently")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
