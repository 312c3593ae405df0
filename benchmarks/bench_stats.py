"""Benchmark: the full audit (stats.audit_summary) over a synthetic 10M-row positions table.

Usage::

    .venv/bin/python benchmarks/bench_stats.py [--rows 10000000] [--out /tmp/bench_stats]

Step 1 (this process) writes a synthetic exact run (schema v1, tests/_synthetic.py) and
a reference run as Parquet. Step 2 runs the full audit in a fresh subprocess, so its
peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is the audit's alone, and
reports wall time from scanning the Parquet files to the finished JSON dict.
Target (issue 5): ≤ 10 s and ≤ 4 GB on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "audit"))
sys.path.insert(0, str(ROOT))


def write(out: Path, rows: int, k: int = 7, rounds: int = 50) -> None:
    from _synthetic import THETA_GRID, make_run

    # rows = n_requests * rounds * (k + 1): k drafts + 1 recovery/bonus per round.
    n_requests = max(1, rows // (rounds * (k + 1)))
    for name, seed in (("run", 0), ("ref", 1)):
        frames = make_run(n_requests, rounds, k, seed=seed, run_id=name, rule="exact")
        d = out / name
        for table, df in frames.items():
            (d / table).mkdir(parents=True, exist_ok=True)
            df.write_parquet(d / table / "part-00000.parquet")
        manifest = {"run_id": name, "config": {"rule": "exact", "theta_grid": list(THETA_GRID)}}
        (d / "manifest.json").write_text(json.dumps(manifest))
        if name == "run":
            print(f"positions rows: {frames['positions'].height:,}", flush=True)
        del frames


def audit(out: Path) -> None:
    import polars as pl

    from relaxspec_audit import audit as stats

    def frames(d: Path) -> stats.RunFrames:
        scan = {t: pl.scan_parquet(str(d / t / "*.parquet")) for t in stats_tables}
        manifest = json.loads((d / "manifest.json").read_text())
        return stats.RunFrames(scan["positions"], scan["rounds"], scan["requests"], [manifest])

    stats_tables = ("positions", "rounds", "requests")
    # Import the lazy scientific stack first: its one-off cost is reported apart.
    t0 = time.perf_counter()
    import scipy.stats  # noqa: F401
    import statsmodels.stats.api  # noqa: F401

    imports = time.perf_counter() - t0
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    summary = stats.audit_summary(
        frames(out / "run"), reference=frames(out / "ref"), ni_margin=0.02
    )
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    # CPU seconds of this process (all threads): independent of other users' load, so
    # wall ≈ cpu / cores on an idle machine.
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux
    print(
        json.dumps(
            {
                "wall_s": round(wall, 2),
                "import_s": round(imports, 2),
                "cpu_s": round(cpu, 2),
                "load_avg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
                "peak_rss_gb": round(rss_gb, 2),
                "n_positions": summary["n_positions"],
                "tau_mean": summary["tau_mean"],
                "keys": list(summary),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_stats"))
    ap.add_argument("--audit-only", action="store_true", help="(internal) step 2 only")
    args = ap.parse_args()
    if args.audit_only:
        audit(args.out)
        return
    t0 = time.perf_counter()
    write(args.out, args.rows)
    print(f"wrote synthetic runs in {time.perf_counter() - t0:.1f} s", flush=True)
    res = subprocess.run(
        [sys.executable, __file__, "--audit-only", "--out", str(args.out)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(res.stdout.strip().splitlines()[-1])
    import polars as pl

    print(
        f"full audit: {result['wall_s']} s (+ {result['import_s']} s one-off scipy/statsmodels "
        f"import), CPU time {result['cpu_s']} s, 1-min load average before/after "
        f"{result['load_avg_1min']}, peak RSS {result['peak_rss_gb']} GB, "
        f"{result['n_positions']:,} positions rows | {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, polars {pl.__version__}, POLARS_MAX_THREADS="
        f"{os.environ.get('POLARS_MAX_THREADS', 'default')}"
    )


if __name__ == "__main__":
    main()
