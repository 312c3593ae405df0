"""Benchmark: what the code scorer's second process costs per scored completion.

Usage::

    .venv/bin/python benchmarks/bench_sandbox.py [--repeats 20] [--items 0,32,38,129]

Interleaves, per repeat and per HumanEval item, the two shapes on the canonical solution:
the one-process shape the scorer used to run (prompt + completion + tests + ``check`` in
one sandboxed interpreter, ``sandbox.run_program(program)``) and the checked shape it runs
now (``score_code``: the candidate and the checker, two sandboxed interpreters and a pipe
per call). Prints the median wall seconds of each and their ratio, with the machine and
its load (the two shapes share the machine in the same run, so the ratio is what to read).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--items", default="0,32,38,129", help="HumanEval problem numbers")
    args = parser.parse_args()
    from relaxspec_audit.tasks import load_task, sandbox
    from relaxspec_audit.tasks.scorers import score_code, truncate_code

    by_id = {item.id: item for item in load_task("humaneval").items}
    items = [by_id[f"HumanEval/{n}"] for n in args.items.split(",")]
    sandbox.isolation()  # probed once, outside the timings
    load = os.getloadavg()[0]
    one, two = [], []
    for _ in range(args.repeats):
        for item in items:
            entry = item.metadata["entry_point"]
            program = item.prompt + truncate_code(item.reference) + "\n"
            program += item.metadata["test"] + f"\ncheck({entry})\n"
            t0 = time.perf_counter()
            assert sandbox.run_program(program).passed
            t1 = time.perf_counter()
            assert score_code(item, item.reference) == 1.0
            t2 = time.perf_counter()
            one.append(t1 - t0)
            two.append(t2 - t1)
    a, b = statistics.median(one), statistics.median(two)
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, isolation {sandbox.isolation()}")
    print(f"load average: {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(f"{len(one)} scores per shape ({args.repeats} repeats x {len(items)} items), interleaved")
    print(f"| shape | median s |\n| --- | --- |\n| one process | {a:.3f} |\n| checked | {b:.3f} |")
    print(f"checked / one process: {b / a:.2f}x")


if __name__ == "__main__":
    main()
