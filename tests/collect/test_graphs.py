"""CUDA-graph replay of the batched engine's fixed-shape calls (collect.graphs, issue 12).

On a CPU the contract the engine relies on is tested with :func:`graphs.eager_capture`:
static input buffers read at replay, one output buffer per shape rewritten by each
replay (so a call must return a copy), and capture-time calls that touch only the scratch
slot of the KV cache. That the CUDA graph replays the kernels faithfully is the CUDA test
at the end (skipped without a GPU; `benchmarks/gpu.sh` runs it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relaxspec_audit import collect, tasks
from relaxspec_audit.collect import adapter, batched, graphs
from relaxspec_audit.collect.config import EMBEDDED_DIR, ConfigError, RunConfig
from relaxspec_audit.collect.fastmodel import FastLM
from relaxspec_audit.collect.pair import DecodeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair():
    return collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")


def _requests(pair, n: int) -> list[tuple[str, list[int]]]:
    items = tasks.load_task("arith", limit=n).items
    return [(it.id, collect.encode_prompt(pair, it.prompt)) for it in items]


def test_graphed_calls_equal_eager_calls_and_leave_real_slots_alone(pair):
    # Two FastLMs over the same weights, each with its own cache: one called eagerly, one
    # through GraphedLM. Same call sequence (a prefill, then [B, 1] steps and a [B, 3]
    # block at per-row positions, one row idle at the scratch slot): equal logits, equal
    # caches. Capturing a new shape after real writes changes no real slot.
    eager, fast = FastLM.from_hf(pair.target), FastLM.from_hf(pair.target)
    for m in (eager, fast):
        m.setup_cache(3, 40)
    graphed = graphs.GraphedLM(fast, capture=graphs.eager_capture)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 400, (3, 8), generator=gen)  # [B, T]
    pos = torch.arange(8)[None].repeat(3, 1)  # [B, T]
    with torch.inference_mode():
        for m in (eager, fast):
            m(ids, pos, keep=1)  # prefill stays eager in the engine
        lengths = torch.tensor([8, 8, 40])  # row 2 idle: the scratch slot
        for step in range(4):
            tok = torch.randint(0, 400, (3, 1), generator=gen)
            p = torch.where(lengths[:, None] < 40, lengths[:, None] + step, 40)  # [B, 1]
            torch.testing.assert_close(graphed(tok, p, keep=1), eager(tok, p, keep=1))
        before = fast.k_cache[..., :40, :].clone()
        graphed._new(torch.zeros(3, 3, dtype=torch.long), None)  # a new shape, captured
        assert torch.equal(fast.k_cache[..., :40, :], before)
        block = torch.randint(0, 400, (3, 3), generator=gen)
        p = torch.tensor([[12, 13, 14], [12, 13, 14], [40, 40, 40]])
        torch.testing.assert_close(graphed(block, p), eager(block, p))
        assert graphed.n_graphs == 2  # [3, 1] keep=1 and [3, 3]
    torch.testing.assert_close(fast.k_cache[..., :40, :], eager.k_cache[..., :40, :])
    torch.testing.assert_close(fast.v_cache[..., :40, :], eager.v_cache[..., :40, :])


def test_a_call_returns_a_copy_that_the_next_replay_leaves_alone(pair):
    fast = FastLM.from_hf(pair.draft)
    fast.setup_cache(2, 16)
    graphed = graphs.GraphedLM(fast, capture=graphs.eager_capture)
    with torch.inference_mode():
        a = graphed(torch.tensor([[5], [6]]), torch.tensor([[0], [0]]), keep=1)
        kept = a.clone()
        graphed(torch.tensor([[7], [8]]), torch.tensor([[1], [1]]), keep=1)
    assert torch.equal(a, kept)


@pytest.mark.parametrize("rule, temperature", [("greedy", 0.0), ("exact", 1.0), ("target", 0.0)])
def test_the_engine_through_graphs_logs_what_it_logs_eagerly(pair, rule, temperature):
    # The engine's three call sites (draft steps, verify, target-only steps) through
    # GraphedLM with the eager stand-in: every request's log identical, rows refilled
    # mid-batch (6 requests, batch 4), attention windows of 8 slots growing with the rows
    # (one graph per shape and window).
    reqs = _requests(pair, 6)
    config = RunConfig(rule=rule, k=4, max_new_tokens=16, device="cpu", temperature=temperature)

    def decode(graphed: bool):
        engine = batched.BatchedEngine(pair, config, 4, max(len(p) for _, p in reqs))
        engine.kv_block = 8
        if graphed:
            engine._target_call = graphs.GraphedLM(engine.target, capture=graphs.eager_capture)
            if engine.draft is not None:
                engine._draft_call = graphs.GraphedLM(engine.draft, capture=graphs.eager_capture)
        return {r.request_id: r for r in engine.run(reqs, timing=False)}, engine

    plain, _ = decode(False)
    viagraph, engine = decode(True)
    assert engine._target_call.n_graphs > 1 + (rule != "target")  # several windows
    for rid, one in plain.items():
        two = viagraph[rid]
        assert one.request["output_ids"] == two.request["output_ids"]
        for col, values in one.positions.items():
            _same(values, two.positions[col], (rid, col))


def test_cuda_graphs_is_a_cuda_option_outside_the_run_id(pair):
    base = RunConfig(device="cpu")
    assert RunConfig(device="auto", cuda_graphs=True).run_id() == RunConfig(device="auto").run_id()
    with pytest.raises(ConfigError, match="cuda_graphs: needs a CUDA device"):
        RunConfig(device="cpu", cuda_graphs=True).validate()
    with pytest.raises(ConfigError, match="cuda_graphs: must be a bool"):
        RunConfig(device="auto", cuda_graphs="yes").validate()
    # device auto on a CPU machine: refused by the engine, before any decoding
    auto = RunConfig(**{**base.to_dict(), "device": "auto", "cuda_graphs": True})
    with pytest.raises(DecodeError, match="cuda_graphs needs a CUDA device"):
        batched.BatchedEngine(pair, auto, 2, 16)
    # graphs replay FastLM's fixed shapes: transformers' own caches have none
    via_hf = adapter.Adapter(adapter.TRANSFORMERS, "forced")
    with pytest.raises(DecodeError, match=r"cuda_graphs needs the static-cache model.*forced"):
        batched.BatchedEngine(pair, auto, 2, 16, adapter=via_hf)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run benchmarks/gpu.sh)")
def test_cuda_graph_replay_logs_what_eager_cuda_logs():
    pair = collect.load_pair(
        str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cuda", "float32"
    )
    reqs = _requests(pair, 12)
    for rule, temperature in (("greedy", 0.0), ("exact", 1.0), ("target", 0.0)):
        cfg = RunConfig(rule=rule, k=4, max_new_tokens=24, device="cuda", temperature=temperature)
        runs = {}
        for on in (False, True):
            c = RunConfig(**{**cfg.to_dict(), "cuda_graphs": on})
            runs[on] = {r.request_id: r for r in batched.decode_batched(pair, reqs, c, 8)}
        for rid, one in runs[False].items():
            two = runs[True][rid]
            assert one.request["output_ids"] == two.request["output_ids"], (rule, rid)
            _same(one.positions.get("cause"), two.positions.get("cause"), (rule, rid))


def _same(a, b, where) -> None:
    """Equal log columns: arrays exactly, lists of per-row arrays (or None) item by item."""
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=str(where))
        return
    assert len(a) == len(b), where
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None) and (x is None or np.array_equal(x, y)), where
