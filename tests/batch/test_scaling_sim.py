"""The throughput simulation of the Ray engine (``benchmarks/scaling_sim.py``).

The simulation is a model, so these tests check what must hold whatever its figures: one
worker does the shards one after another, a pool never beats its size nor the shard count,
a shard's requests never take longer than the whole shard, and a worker's death costs at
most one shard's time plus a fresh worker's load and dispatch.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scaling_sim.py"


def _load():
    # benchmarks/ is a folder of scripts, not a package: load the file as a module.
    spec = importlib.util.spec_from_file_location("scaling_sim", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_sim"] = module  # dataclasses look their module up while defined
    spec.loader.exec_module(module)
    return module


sim = _load()
SMALL = sim.Workload(runs=4, items=40)


def _shards(device, size=8, seed=0):
    prompt, completion = SMALL.draw(np.random.default_rng(seed))
    return sim.plan(prompt, completion, size, device)


@pytest.mark.parametrize("device", [sim.CPU, sim.GPU], ids=["cpu", "gpu"])
def test_one_worker_is_the_sum_of_shards_plus_start_up(device):
    shards = _shards(device)
    seconds = [s.time.seconds for s in shards]
    span = sim.makespan(seconds, 1, device.load_s, overhead_s=0.5)
    assert span == pytest.approx(device.load_s + sum(seconds) + 0.5 * len(shards))
    rows = sim.simulate(device, SMALL, [8], [1], overhead_s=0.5, serial_s=7.0)
    assert rows[0].makespan_s == pytest.approx(7.0 + span)
    assert rows[0].speedup == pytest.approx(1.0)


def test_a_single_request_costs_its_prefill_and_its_steps():
    device = sim.CPU
    t = sim.shard_time(np.array([300]), np.array([40]), device, commit_every=16)
    steps = np.ceil(40 / device.tokens_per_step)
    assert t.seconds == pytest.approx(300 / device.prefill_tok_s + steps * device.step_s(1))
    assert t.commits == ((t.seconds, 1),)
    assert t.order == (0,)


@pytest.mark.parametrize("device", [sim.CPU, sim.GPU], ids=["cpu", "gpu"])
def test_speedup_never_exceeds_workers_nor_shards(device):
    workers = [1, 2, 3, 4, 8, 16, 32, 64]
    for deaths in (0, 3):
        rows = sim.simulate(device, SMALL, [4, 8, 40], workers, n_deaths=deaths, seed=1)
        assert len(rows) == 3 * len(workers)
        for r in rows:
            assert r.speedup <= r.workers + 1e-9, r
            assert r.speedup <= r.shards + 1e-9, r
            assert r.speedup >= 1 - 1e-9, r  # more workers never slow list scheduling here


def test_scaling_is_near_linear_then_flat_when_workers_exceed_shards():
    rows = sim.simulate(sim.CPU, sim.Workload(), [82], [1, 4, 16, 32])
    by_w = {r.workers: r for r in rows}
    assert by_w[16].shards == 16
    assert by_w[4].speedup > 3.4  # 16 shards of minutes each: four workers keep busy
    assert by_w[32].makespan_s == pytest.approx(by_w[16].makespan_s)  # nothing left to share


def test_a_subset_of_a_shard_never_takes_longer():
    # The death bound rests on it: a re-run of the uncommitted requests is no longer than
    # the shard (steps and prefill are affine in the work).
    rng = np.random.default_rng(3)
    for device in (sim.CPU, sim.GPU):
        for _ in range(20):
            n = int(rng.integers(2, 100))
            prompt = rng.integers(20, 800, size=n)
            completion = rng.integers(1, 192, size=n)
            full = sim.shard_time(prompt, completion, device).seconds
            keep = np.sort(rng.choice(n, size=int(rng.integers(1, n)), replace=False))
            part = sim.shard_time(prompt[keep], completion[keep], device).seconds
            assert part <= full + 1e-9


@pytest.mark.parametrize("device", [sim.CPU, sim.GPU], ids=["cpu", "gpu"])
def test_a_death_adds_at_most_one_shard_load_and_dispatch(device):
    overhead = 0.5
    shards = _shards(device, size=40, seed=2)  # 40 requests: several commits per shard
    seconds = [s.time.seconds for s in shards]
    which, at = sim.deaths(len(shards), 3, np.random.default_rng(5))
    delay = np.zeros(len(shards))
    bound = 0.0
    for i, u in zip(which, at, strict=True):
        delay[i] = sim.death_delay(shards[i], u, device, overhead)
        bound += seconds[i] + device.load_s + overhead
    assert delay[which].min() > 0 or device.load_s == 0  # a death is never free
    for w in (1, 2, 3, 8):
        base = sim.makespan(seconds, w, device.load_s, overhead)
        hit = sim.makespan(seconds, w, device.load_s, overhead, delay)
        assert base <= hit <= base + bound + 1e-9
    # One worker runs everything in turn: the deaths add exactly their delays.
    one = sim.makespan(seconds, 1, device.load_s, overhead, delay)
    assert one == pytest.approx(sim.makespan(seconds, 1, device.load_s, overhead) + delay.sum())


def test_a_death_after_a_commit_keeps_the_committed_requests():
    device = sim.CPU
    shard = _shards(device, size=40)[0]
    first_commit, committed = shard.time.commits[0]
    assert committed == 16
    early = sim.death_delay(shard, 0.0, device, 0.0)  # nothing committed: the whole shard
    assert early == pytest.approx(device.load_s)
    late = first_commit / shard.time.seconds + 1e-9  # just after the first commit
    rest = np.asarray(shard.time.order[16:])
    redo = sim.shard_time(shard.prompt[rest], shard.completion[rest], device).seconds
    expected = first_commit + device.load_s + redo - shard.time.seconds
    assert sim.death_delay(shard, late, device, 0.0) == pytest.approx(expected, rel=1e-6)


def test_bad_inputs_are_refused_with_the_place_named():
    with pytest.raises(ValueError, match="makespan: workers"):
        sim.makespan([1.0], 0, 0.0)
    with pytest.raises(ValueError, match="plan: shard_size"):
        sim.plan(np.ones((1, 2), int), np.ones((1, 2), int), 0, sim.CPU)
    shard = _shards(sim.CPU)[0]
    with pytest.raises(ValueError, match="death_delay: at"):
        sim.death_delay(shard, 1.0, sim.CPU, 0.0)


def test_the_table_prints_every_row():
    rows = sim.simulate(sim.GPU, SMALL, [8, 40], [1, 2])
    text = sim.format_table(rows, markdown=True)
    assert text.count("\n") == 1 + len(rows)
    assert "| gpu | 40 | 4 | 2 |" in text
