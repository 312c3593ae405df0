"""collect() (collect.run): a run folder written in process and by the CLI, resumed after a kill.

Moved from test_decoder.py, which tests decoding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from test_decoder import _pair

from relaxspec_audit import collect
from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _task_file(path: Path, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"q{i:02d}", "prompt": f"{i}+{i}=", "reference": 2 * i}))
            fh.write("\n")
    return path


def _collect_cmd(tiny, task: Path, out: Path, extra=()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "relaxspec_audit.cli",
        "collect",
        "--task",
        str(task),
        "--target",
        str(tiny.target_dir),
        "--draft",
        str(tiny.draft_dir),
        "--rule",
        "nucleus",
        "--theta",
        "0.9",
        "--k",
        "3",
        "--max-new-tokens",
        "12",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--chunk-size",
        "1",
        "--no-progress",
        *extra,
    ]


@pytest.mark.slow
def test_collect_resume_after_sigkill(tiny_llama_pair, tmp_path):
    """Killed mid-batch (4 rows in flight, continuous batching): resume loses nothing."""
    n_items = 10
    task = _task_file(tmp_path / "mini.jsonl", n_items)
    out = tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        _collect_cmd(tiny_llama_pair, task, out, ("--batch-size", "4")),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    committed: set[str] = set()
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            runs = list(out.glob("task=*/rule=*/run=*"))
            committed = logs.finished_request_ids(runs[0]) if runs else set()
            if len(committed) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"finished before the kill: {proc.stderr.read()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    (run_dir,) = out.glob("task=*/rule=*/run=*")
    before = logs.finished_request_ids(run_dir)
    assert 3 <= len(before) < n_items
    assert logs.read_manifest(run_dir)["status"] == "running"  # killed, never finished
    # resume in a second process
    res = subprocess.run(
        _collect_cmd(tiny_llama_pair, task, out, ("--batch-size", "4")),
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert str(run_dir) in res.stdout and "requests 10" in res.stdout
    req = logs.scan(run_dir, "requests").collect()
    assert sorted(req["request_id"]) == [f"q{i:02d}" for i in range(n_items)]  # none lost/dup
    pos = logs.scan(run_dir, "positions").collect()
    assert pos.select("request_id", "round", "pos", "kind").is_duplicated().sum() == 0
    man = logs.read_manifest(run_dir)
    assert man["status"] == "complete" and man["resumed_at"] and man["n_requests"] == n_items
    # identical to an uninterrupted in-process run (coupled randomness makes it deterministic)
    cfg = RunConfig(
        task=str(task),
        target=str(tiny_llama_pair.target_dir),
        draft=str(tiny_llama_pair.draft_dir),
        rule="nucleus",
        params={"theta": 0.9},
        k=3,
        max_new_tokens=12,
        device="cpu",
    )
    assert cfg.run_dir(out) == run_dir  # the CLI built the same config
    fresh = collect.collect(cfg, tmp_path / "fresh", pair=_pair(tiny_llama_pair))
    ref = logs.scan(fresh, "requests").collect().sort("request_id")
    got = req.sort("request_id")
    assert got["output_sha256"].to_list() == ref["output_sha256"].to_list()
    emitted = pos.filter((pl.col("kind") != "draft") | pl.col("accepted"))
    n_logged = emitted.group_by("request_id").agg(pl.len(), pl.col("abs_pos").n_unique())
    both = got.join(n_logged, on="request_id")
    assert (both["len"] == both["n_tokens"]).all() and (both["abs_pos"] == both["n_tokens"]).all()


def test_collect_in_process_and_summary(tiny_qwen2_pair, tmp_path):
    from relaxspec_audit._cli.collect import summary_line

    task = _task_file(tmp_path / "mini.jsonl", 4)
    cfg = RunConfig(
        task=str(task),
        target=str(tiny_qwen2_pair.target_dir),
        draft=str(tiny_qwen2_pair.draft_dir),
        rule="asd",
        temperature=0.0,
        k=3,
        max_new_tokens=10,
    )
    events = []
    run_dir = collect.collect(cfg, tmp_path, pair=_pair(tiny_qwen2_pair), progress=events.append)
    assert events[0]["done"] == 0 and events[-1]["done"] == 4 and events[-1]["total"] == 4
    req = logs.scan(tmp_path, "requests").collect()
    assert req["split"].is_in(["discovery", "confirmation"]).all()
    assert req["score"].is_not_null().all()  # numeric references → scored
    assert req["text"].to_list() == [
        tiny_qwen2_pair.tokenizer.decode(ids, skip_special_tokens=True)
        for ids in req["output_ids"].to_list()
    ]
    rounds = logs.scan(tmp_path, "rounds").collect()
    assert rounds["spent"].is_not_null().all() and set(rounds["rule"]) == {"asd"}
    line = summary_line(run_dir)
    assert line.startswith("requests 4  tokens ") and "mean tau" in line
    # a second collect of the same config resumes: nothing to do, nothing duplicated, and
    # the complete run's manifest (its engine, commit, times) is left as it was written
    manifest = (run_dir / "manifest.json").read_bytes()
    collect.collect(cfg, tmp_path, pair=_pair(tiny_qwen2_pair))
    assert logs.scan(tmp_path, "requests").collect().height == 4
    assert (run_dir / "manifest.json").read_bytes() == manifest
    # a complete run made before cost tables existed gains the one it is given, nothing else
    old = json.loads(manifest)
    table = old.pop("cost_table", None) or {"id": "t0", "draft_step_s": 1.0}
    (run_dir / "manifest.json").write_text(json.dumps(old, indent=2, sort_keys=True))
    collect.collect(cfg, tmp_path, pair=_pair(tiny_qwen2_pair), cost_table=table)
    assert json.loads((run_dir / "manifest.json").read_text()) == {**old, "cost_table": table}
