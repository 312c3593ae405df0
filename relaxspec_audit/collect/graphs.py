"""CUDA-graph replay of the batched engine's fixed-shape forward calls.

Within a run the batched engine calls :class:`~relaxspec_audit.collect.fastmodel.FastLM`
with a handful of shapes that never change: the draft's first step ``[B, 2]`` and its
later steps ``[B, 1]`` (``keep=1``), the target's verify pass ``[B, K + 1]`` and a
target-only step ``[B, 1]``, each over an attention window of a multiple of
``batched.KV_BLOCK`` slots (a few per run: one graph per shape and window). Eagerly, each
call is a few hundred small kernel launches plus Python; at batch 1 on an H200 that is
what held a decode step at 2.9 % of the bandwidth roofline (issue 12). A CUDA graph
replays the launches as one.

After PyTorch's CUDA-graph recipe (``torch.cuda.graphs``; gpt-fast gets the same from
``torch.compile(mode="reduce-overhead")``): per shape, warm up on a side stream, capture
one call over static input buffers, then for every call copy the inputs in and replay.
Manual capture keeps set-up to a few calls per shape, with no compile step.

Capture never disturbs a row: warm-up and capture run with every position at the scratch
slot ``S_max``, which FastLM writes and no query attends (fastmodel's padding contract),
so the KV cache's real slots are untouched. The graph's output buffer is rewritten by the
next replay of its shape, so a call returns a copy. Prefill (variable length, ``rows=``)
stays eager. Graphs of one model share a memory pool: they never run concurrently and no
output is kept across replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: Eager calls on a side stream before capture (lazy init, cuBLAS workspaces, autotuning).
WARMUP = 3

#: A capture backend: ``(fn, pool) -> (replay, out, pool)``. ``fn`` computes the call from
#: the static buffers; ``replay`` recomputes it into ``out``; ``pool`` is the memory pool
#: the graphs of one model share (None before the first capture).
Capture = Callable[[Callable[[], torch.Tensor], Any], tuple[Callable[[], None], torch.Tensor, Any]]


@dataclass
class _Graph:
    ids: torch.Tensor  # [B, T] static input
    pos: torch.Tensor  # [B, T] static input
    out: torch.Tensor  # [B, keep or T, V] static output
    replay: Callable[[], None]


class GraphedLM:
    """``model(ids, input_pos, keep=...)`` replayed from one captured graph per shape.

    Args:
        model: a FastLM whose cache is set up (its shapes fix the graphs).
        capture: the capture backend (default: :func:`cuda_capture`); tests on a CPU pass
            :func:`eager_capture`, which keeps the static-buffer contract without CUDA.
    """

    def __init__(self, model: Any, capture: Capture | None = None) -> None:
        self.model = model
        self._capture = capture or cuda_capture
        self._graphs: dict[tuple[tuple[int, ...], int | None, int | None], _Graph] = {}
        self._pool: Any = None

    @property
    def n_graphs(self) -> int:
        """Shapes captured so far."""
        return len(self._graphs)

    def __call__(
        self,
        ids: torch.Tensor,
        input_pos: torch.Tensor,
        keep: int | None = None,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Logits of ``ids`` at ``input_pos`` (as ``FastLM.forward``), a fresh tensor."""
        key = (tuple(ids.shape), keep, kv_len)  # the attention window is a shape too
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._new(ids, keep, kv_len)
        graph.ids.copy_(ids)
        graph.pos.copy_(input_pos)
        graph.replay()
        return graph.out.clone()

    def _new(self, ids: torch.Tensor, keep: int | None, kv_len: int | None = None) -> _Graph:
        static_ids = torch.zeros_like(ids)  # [B, T]
        static_pos = torch.full_like(ids, self.model.scratch)  # [B, T]: writes hit scratch only
        replay, out, self._pool = self._capture(
            lambda: self.model(static_ids, static_pos, keep=keep, kv_len=kv_len), self._pool
        )
        return _Graph(static_ids, static_pos, out, replay)


def cuda_capture(
    fn: Callable[[], torch.Tensor], pool: Any
) -> tuple[Callable[[], None], torch.Tensor, Any]:
    """Warm ``fn`` up on a side stream, capture it into a CUDA graph in ``pool``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph.replay, out, graph.pool()


def eager_capture(
    fn: Callable[[], torch.Tensor], pool: Any
) -> tuple[Callable[[], None], torch.Tensor, Any]:
    """A stand-in for :func:`cuda_capture` on any device: replay recomputes into ``out``.

    It keeps what the engine relies on (static inputs read at replay, one output buffer
    rewritten by each replay, capture-time calls at the scratch slot) so that contract is
    tested on a CPU; whether CUDA replays the kernels faithfully is a GPU test.
    """
    for _ in range(WARMUP):
        fn()
    out = fn()
    return lambda: out.copy_(fn()), out, pool
