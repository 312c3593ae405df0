"""The decode engine: B requests per target pass, each row at its own positions.

There is one engine, and every run decodes through it: any transformers causal LM, any
batch size (a one-request decode is batch 1, :func:`decode_request`), speculative or
target-only (the round with ``K = 0``). It talks to the models through one call, the model
adapter's (``collect.adapter``): FastLM over static caches for Llama-family pairs, else
transformers' own caches, one per row; :func:`~relaxspec_audit.collect.adapter.choose_adapter`
picks it once per pair and the manifest's ``engine`` record says which and why.

Each call of :meth:`BatchedEngine.run`'s loop is one round for every row
(:meth:`BatchedEngine._round`, its pieces in :mod:`~relaxspec_audit.collect.round`).
Continuous batching: a row that finishes (EOS, stop string, length limit) is handed to the
sink and refilled with the next request; refilled rows are prefilled together. Once every
request is admitted, the batch halves while at most half its rows are live (live rows move
into the first slots, :meth:`BatchedEngine._narrow`), so a draining run's tail does not pay
for idle rows.

A request's log does not depend on its batch-mates in what is drawn: every uniform is keyed
by ``(seed, request, absolute position, purpose)`` (THEORY §4). Float results do depend on
the batch (a row's matmul differs between 1, 2 and ≥ 5 rows) and on the adapter, so logs at
different batch sizes or through different adapters agree in floats within a tolerance
and in decisions up to the first near-tie (THEORY §4; tests/collect/test_batched.py checks
that contract).

Logging: a :class:`~relaxspec_audit.collect.roundlog._RoundLog` per row (a ``_TokenLog``
target-only), batched over rounds, and flushed for every row together once one is due; a
row's ``draft_s`` / ``verify_s`` are its batch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from relaxspec_audit.collect.adapter import STATIC, Adapter, choose_adapter
from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig
from relaxspec_audit.collect.graphs import GraphedLM
from relaxspec_audit.collect.logs import RequestRows, output_sha256
from relaxspec_audit.collect.pair import DecodeError, Pair, check_prompts_fit
from relaxspec_audit.collect.round import (
    RoundHost,
    Row,
    Timer,
    block_lengths,
    cut_emitted,
    decide,
    draft_block,
    plan_round,
    raise_nonfinite,
    read_round,
    used_flags,
    verify_block,
)
from relaxspec_audit.collect.roundlog import (
    RoundOutcome,
    RoundRecord,
    RoundTensors,
    _RoundLog,
    _rounds,
    _TokenLog,
    flush_together,
)
from relaxspec_audit.collect.sampling import _host_uniforms
from relaxspec_audit.collect.stops import StopStrings
from relaxspec_audit.verify import rng

#: Batch size of ``batch_size=None`` ("auto"). On CPU 16 rows, not fewer: MKL's fp32 GEMM
#: is slower at 4-12 rows than at 16, so a real pair's round costs 209 ms per row at 16 rows
#: against 314 at 8 (docs/PERFORMANCE.md, "Where the real pair's batch-16 time goes"); a
#: GPU wants many rows.
AUTO_BATCH = {"cpu": 16, "cuda": 64, "mps": 16}

#: Calls attend the cache slots below the batch's furthest position, rounded up to a
#: multiple of this (FastLM's ``kv_len``). The static cache is sized for the longest prompt
#: plus ``max_new_tokens``; HumanEval rows sit near a third of that, and attending the whole
#: cache cost a bf16 verify pass 24 % on the CPU (docs/PERFORMANCE.md, "The attention
#: window"). Rounding keeps CUDA-graph captures to ``S_max / KV_BLOCK`` per shape; on a CPU
#: it costs at most 127 masked keys.
KV_BLOCK = 128


def resolve_batch_size(batch_size: int | None, device: torch.device, n_requests: int) -> int:
    """``batch_size``, or the automatic choice for ``device`` (:data:`AUTO_BATCH`).

    Never more rows than requests: an idle row costs as much as a busy one.
    """
    b = batch_size if batch_size is not None else AUTO_BATCH.get(device.type, AUTO_BATCH["cpu"])
    return max(1, min(b, n_requests))


def kv_bytes(pair: Pair, batch_size: int, max_seq_len: int, adapter: Adapter | None = None) -> int:
    """Bytes of the KV caches (target and draft) for a batch (nothing allocated).

    Through ``adapter`` (None: :func:`~relaxspec_audit.collect.adapter.choose_adapter`); 0
    where the transformers adapter cannot tell a model's cache shapes.
    """
    adapter = adapter or choose_adapter(pair)
    models = [m for m in (pair.target, pair.draft) if m is not None]
    return sum(adapter.wrap(m).cache_bytes(batch_size, max_seq_len) or 0 for m in models)


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_kv_fits(need: int, device: torch.device, batch_size: int, max_seq_len: int) -> None:
    """Raise before any allocation when KV caches of ``need`` bytes cannot fit on ``device``.

    Raises:
        DecodeError: naming the batch size, the sequence length, the cache size and the
            free memory of the device.
    """
    free = _free_bytes(device)
    # Keep half the free memory for weights' activations, logits and the logs' tensors.
    if free is not None and need > free // 2:
        raise DecodeError(
            f"batch_size {batch_size} × max_seq_len {max_seq_len}: the KV caches need "
            f"{need / 2**20:.1f} MiB, more than half of the {free / 2**20:.1f} MiB free on "
            f"{device}; lower --batch-size or max_new_tokens"
        )


class BatchedEngine:
    """Decode many requests of one run, ``batch_size`` rows at a time (continuous batching).

    Build once per run (it sizes the KV caches for ``max_prompt`` + ``max_new_tokens``) and
    call :meth:`run`, as often as wanted. ``narrow``: halve the batch while at most half its
    rows are live once every request has been admitted (:meth:`_narrow`; off only to
    measure what it saves). ``adapter``: the model adapter (None: the pair's,
    :func:`~relaxspec_audit.collect.adapter.choose_adapter`). ``rule_fn`` replaces the
    registered rule function (tests of deliberately broken rules).
    """

    def __init__(
        self,
        pair: Pair,
        config: RunConfig,
        batch_size: int,
        max_prompt: int,
        stops: StopStrings | None = None,
        narrow: bool = True,
        adapter: Adapter | None = None,
        rule_fn: Callable[..., Any] | None = None,
    ) -> None:
        self.pair, self.config, self.b, self.stops = pair, config, batch_size, stops
        self.adapter = adapter or choose_adapter(pair)
        self.narrow = narrow
        self.widths: list[int] = []  # the widths the batch narrowed to, in order
        self.k = 0 if config.rule == TARGET_ONLY else config.k
        if self.k and pair.draft is None:
            raise DecodeError(f"rule {config.rule!r} needs a draft model; the pair has none")
        self.rule = rule_fn or (config.spec.fn if self.k else None)
        self.device, self.vocab = pair.device, pair.vocab_size
        eos = sorted(pair.eos_ids)
        self._eos = torch.tensor(eos, device=self.device) if eos else None  # [E]
        # Positions a row can reach: prompt + output + the K drafts of the last round.
        self.s_max = max_prompt + config.max_new_tokens + self.k + 1
        self.kv_block = KV_BLOCK  # attention windows round up to this (S_max or more: none)
        self.graphs = config.cuda_graphs
        if self.graphs and self.adapter.kind != STATIC:
            raise DecodeError(f"cuda_graphs needs the static-cache model; this pair decodes "
                              f"through transformers' caches ({self.adapter.reason})")  # fmt: skip
        if self.graphs and self.device.type != "cuda":
            raise DecodeError(f"cuda_graphs needs a CUDA device; the pair is on {self.device}")
        self.target = self.adapter.wrap(pair.target)
        self.draft = self.adapter.wrap(pair.draft) if self.k else None
        models = [m for m in (self.target, self.draft) if m is not None]
        sizes = [m.cache_bytes(batch_size, self.s_max) for m in models]
        self.kv_bytes = None if None in sizes else sum(sizes)
        check_kv_fits(self.kv_bytes or 0, self.device, batch_size, self.s_max)
        for model in models:
            model.setup_cache(batch_size, self.s_max)
        self.pos_device = self.target.pos_device
        self._state: torch.Tensor | None = None  # [B] per-row rule state (the ASD ledger)
        # The fixed-shape calls of a round (draft steps, verify); prefill stays eager.
        # Graphs replay the same kernels as the eager calls.
        self._target_call = GraphedLM(self.target) if self.graphs else self.target
        self._draft_call = (
            GraphedLM(self.draft) if self.graphs and self.draft is not None else self.draft
        )

    @property
    def record(self) -> dict[str, Any]:
        """What the manifest records of the engine that runs (its ``engine`` entry)."""
        out = {
            "engine": self.adapter.kind,
            "batch_size": self.b,
            "max_seq_len": self.s_max,
            "kv_cache_bytes": self.kv_bytes,
            "cuda_graphs": self.graphs,
            "narrowing": self.narrow,
        }
        if self.adapter.reason is not None:
            out["reason"] = self.adapter.reason
        return out

    # ------------------------------------------------------------------ continuous batching

    def run(
        self, requests: Iterable[tuple[str, list[int]]], *, timing: bool = True
    ) -> Iterator[RequestRows]:
        """Yield each request's rows as it finishes (not in input order).

        Args:
            requests: ``(request_id, prompt_ids)`` pairs; the id keys the random stream.
            timing: measure ``draft_s`` / ``verify_s`` (synchronises CUDA when on).
        """
        pending = iter(requests)
        rows: list[Row | None] = [None] * self.b
        # An engine serves run after run (its caches and graphs kept): only the rows'
        # rule state and the narrowing record are per run.
        self._state, self.widths = None, []
        drained = False  # every request admitted: free rows stay free from now on
        while True:
            # Inference mode only around the work, never across a `yield`: grad mode is
            # thread state, and a suspended (or abandoned) generator would leak it.
            with torch.inference_mode():
                admitted = []
                for slot in range(len(rows)):
                    if rows[slot] is None and not drained:
                        rows[slot] = self._admit(next(pending, None))
                        if rows[slot] is None:
                            drained = True
                        else:
                            admitted.append(slot)
                if all(r is None for r in rows):
                    return
                self._prefill(admitted, rows)
                if drained and self.narrow:
                    rows = self._narrow(rows)
                finished = self._round(rows, timing)
                done = [self._finish(rows[slot]) for slot in finished]
            for slot in finished:
                rows[slot] = None
            yield from done

    def _narrow(self, rows: list[Row | None]) -> list[Row | None]:
        """The batch halved while at most half its rows are live (after the last request).

        A free row costs a busy one's compute (shapes are fixed), and as a run drains its
        last rows finish at very different rounds (short answers beside long ones). So
        the live rows beyond the new width move into its free rows (their K/V and rule
        state with them) and the calls shrink to ``[w, ...]``: halving keeps the shapes
        few (one CUDA-graph capture per width). A row's results move at the float
        tolerance of any change of batch size, which the contract allows (THEORY §4).
        """
        live = [i for i, r in enumerate(rows) if r is not None]
        w = len(rows)
        while w > 1 and len(live) <= w // 2:
            w //= 2
        if w == len(rows):
            return rows
        src = [i for i in live if i >= w]
        dst = [j for j in range(w) if rows[j] is None][: len(src)]
        if src:
            for model in (self.target, self.draft):
                if model is not None:
                    model.move_rows(src, dst)
            for i, j in zip(src, dst, strict=True):
                rows[j] = rows[i]
            if self._state is not None:
                index = torch.tensor(dst, device=self._state.device)
                moved = self._state[torch.tensor(src, device=self._state.device)]
                self._state = self._state.index_copy(0, index, moved)
        if self._state is not None:
            self._state = self._state[:w].clone()
        self.widths.append(w)
        return rows[:w]

    def _prefill(self, slots: list[int], rows: list[Row | None]) -> None:
        """Prefill the prompts of the rows just admitted, all in one padded pass per model.

        Each row's cache gets all of its prompt but the last token (the first round feeds
        that one). Prefilling the refilled rows together, not one by one, matters once
        prompts are long: the pass is compute-bound, and one ``[n, L]`` call costs little
        more than one ``[1, L]`` call on a GPU and far less than n of them on a CPU.
        """
        slots = [s for s in slots if len(rows[s].prompt) > 1]
        if not slots:
            return
        scratch = self.s_max
        width = max(len(rows[s].prompt) - 1 for s in slots)
        ids = torch.zeros(len(slots), width, dtype=torch.long)  # [n, L], pads: any id
        pos = torch.full((len(slots), width), scratch, dtype=torch.long)  # [n, L]
        for j, s in enumerate(slots):
            head = rows[s].prompt[:-1]
            ids[j, : len(head)] = torch.tensor(head)
            pos[j, : len(head)] = torch.arange(len(head))
        ids, pos = ids.to(self.device), pos.to(self.pos_device)
        which = torch.tensor(slots, device=self.pos_device)
        for model in (self.target, self.draft):
            if model is not None:
                model(ids, pos, rows=which, keep=1, kv_len=self._window(width))

    def _window(self, n: int) -> int:
        """The ``kv_len`` of a call whose positions are all below ``n``: ``n`` rounded up."""
        return min(-(-n // self.kv_block) * self.kv_block, self.s_max)

    def _admit(self, request: tuple[str, list[int]] | None) -> Row | None:
        """A row for the next request (its prompt is prefilled by :meth:`_prefill`)."""
        if request is None:
            return None
        request_id, prompt = request
        if not prompt:
            raise DecodeError(f"request {request_id}: empty prompt (no token ids)")
        cfg = self.config
        key = rng.request_key(request_id)
        n_u = cfg.max_new_tokens + self.k + 1
        row = Row(request_id, list(prompt), list(prompt), _host_uniforms(cfg, key, 0, n_u),
                  time.perf_counter())  # fmt: skip
        row.d_lack = [prompt[-1]]
        if cfg.log_positions:
            if self.k:
                theta = cfg.spec.nucleus_theta(cfg.params)  # in_nucleus at the run's θ
                row.log = _RoundLog(self.k, self.vocab, theta, list(cfg.theta_grid), row.u_all,
                                    share=self.b)  # fmt: skip
            else:
                row.log = _TokenLog(self.vocab, cfg.greedy, len(cfg.theta_grid))
        return row

    def _finish(self, row: Row) -> RequestRows:
        out = row.output
        if row.log is None:
            positions: dict[str, Any] = {}
        elif self.k:
            positions = row.log.columns()
        else:
            positions = row.log.columns(out, row.u_all[2, : len(out)])
        request = {
            "prompt_ids": list(map(int, row.prompt)),
            "output_ids": out,
            "output_sha256": output_sha256(out),
            "n_tokens": len(out),
            "stop": row.stop,
            "target_passes": row.passes,
            "wall_s": time.perf_counter() - row.t_start,
        }
        return RequestRows(row.request_id, positions, _rounds(row.rounds), request)

    # ------------------------------------------------------------------ one round

    def _round(self, rows: list[Row | None], timing: bool) -> list[int]:
        """One round for every live row (K = 0: one target-only token); the finished slots."""
        cfg, k, v = self.config, self.k, self.vocab
        timer = Timer(self.device, timing)
        plan = plan_round(rows, k, self.s_max, cfg.max_new_tokens, self.device, self.pos_device)
        kv = self._window(plan.furthest)
        t0 = timer.now()
        drafts, q, d_bad = draft_block(self._draft_call, plan, k, v, cfg, kv)  # [B, K], [B, K, V]
        lengths = block_lengths(drafts, self._eos, plan.cap)  # [B]
        t1 = timer.now()
        z, t_bad = verify_block(self._target_call, plan, drafts, v, kv)  # [B, K+1, V]
        d_bad, t_bad = used_flags(d_bad, t_bad, lengths, plan.is_live)  # [B, K], [B, K+1]
        res, p = decide(self.rule, cfg, self._state, drafts, q, z, plan.u, lengths)
        self._state = res.state
        host = read_round(drafts, lengths, res, d_bad, t_bad)  # the round's one copy
        t2 = timer.now()
        if host.bad:  # before anything of the round is emitted or logged
            raise_nonfinite(rows, d_bad.cpu().numpy(), t_bad.cpu().numpy())
        times = (t1 - t0 if k else 0.0, t2 - t1)
        tensors = (p, q, z, drafts, res)
        finished = [i for i in plan.live if self._emit(rows[i], i, host, tensors, times)]
        if finished and self._state is not None:  # the next request in a row starts at 0
            index = torch.tensor(finished, device=self._state.device)
            self._state = self._state.index_fill(0, index, 0.0)
        # When one row's log is due, flush every row's together (one token_stats, one E_S
        # grid, one host copy for the batch); finished rows flush in _finish.
        logs = [rows[i].log for i in plan.live if i not in finished and rows[i].log is not None]
        if k and any(len(log.pending) >= log.n_flush for log in logs):
            flush_together(logs)
        return finished

    def _emit(
        self, row: Row, i: int, host: RoundHost, tensors: tuple, times: tuple[float, float]
    ) -> bool:
        """Row ``i``'s tokens of the round, cut at EOS, a stop string or the limit; finished?"""
        k, max_new = self.k, self.config.max_new_tokens
        kr, a, y = int(host.lengths[i]), int(host.accepted[i]), int(host.token[i])
        start = row.n_out
        emitted = [*host.drafts[i, :a].tolist(), y]
        m = min(len(emitted), max_new - start)
        m, row.stop = cut_emitted(emitted, m, row.stop, self.pair.eos_ids, self.stops,
                                  row.output)  # fmt: skip
        truncated = m < len(emitted)  # a truncated round logs only its emitted drafts
        if row.log is not None:
            p, q, z, drafts, res = tensors
            if k:
                row.log.add(RoundTensors.of_row(p, q, z, drafts, res, i, kr),
                            RoundOutcome(start, host.drafts[i, :kr], a, y,
                                         m if truncated else kr, not truncated))  # fmt: skip
            else:
                row.log.add(z[i], None if p is None else p[i : i + 1], res.token[i : i + 1])
        row.seq.extend(emitted[:m])
        row.passes += 1
        spent = None if host.spent is None else float(host.spent[i])
        row.rounds.append(RoundRecord(len(row.rounds), start, kr, m if truncated else a, m,
                                      *times, spent))  # fmt: skip
        if row.stop != "length" or truncated or row.n_out >= max_new:
            return True
        if k:  # what the draft cache lacks: it never ran on x_K when all K were accepted
            row.d_lack = [int(host.drafts[i, k - 1]), y] if a == k else [y]
        return False


def open_engine(
    pair: Pair,
    config: RunConfig,
    requests: list[tuple[str, list[int]]],
    stops: StopStrings | None = None,
    batch_size: int | None = None,
    **engine_kw: Any,
) -> BatchedEngine:
    """The engine for ``requests`` of one run: every prompt checked, the batch resolved.

    Args:
        pair: the loaded pair.
        requests: ``(request_id, prompt_ids)`` pairs (at least one).
        config: the run configuration.
        stops: the task's decode-time stop strings.
        batch_size: rows per target pass (None: ``config.batch_size``, else the device's
            :data:`AUTO_BATCH`).
        **engine_kw: :class:`BatchedEngine`'s options (``narrow``, ``adapter``, ``rule_fn``).

    Raises:
        DecodeError: an empty or too long prompt (named, before anything is allocated),
            a KV cache that cannot fit, a rule that needs a missing draft.
    """
    k = 0 if config.rule == TARGET_ONLY else config.k
    check_prompts_fit(pair, requests, config.max_new_tokens, k)
    b = resolve_batch_size(batch_size or config.batch_size, pair.device, len(requests))
    longest = max(len(ids) for _, ids in requests)
    return BatchedEngine(pair, config, b, longest, stops, **engine_kw)


def decode_batched(
    pair: Pair,
    requests: list[tuple[str, list[int]]],
    config: RunConfig,
    batch_size: int | None = None,
    *,
    timing: bool = True,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    stops: StopStrings | None = None,
    **engine_kw: Any,
) -> Iterator[RequestRows]:
    """Decode ``requests`` batched; yield each one's rows as it finishes.

    Args:
        pair: the loaded pair.
        requests: ``(request_id, prompt_ids)`` pairs.
        config: the run configuration.
        batch_size: rows per target pass (None: ``config.batch_size``, else
            :data:`AUTO_BATCH` for the device).
        timing: measure ``draft_s`` / ``verify_s``.
        on_start: called once, before decoding, with the engine's record
            (:attr:`BatchedEngine.record`).
        stops: the task's decode-time stop strings.
        **engine_kw: :class:`BatchedEngine`'s options (``narrow``, ``adapter``, ``rule_fn``).
    """
    if not requests:
        return
    engine = open_engine(pair, config, requests, stops, batch_size, **engine_kw)
    if on_start is not None:
        on_start(engine.record)
    yield from engine.run(requests, timing=timing)


def decode_request(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    *,
    timing: bool = True,
    stops: StopStrings | None = None,
    **engine_kw: Any,
) -> RequestRows:
    """Decode one request: the engine at batch 1.

    Args:
        pair: the loaded pair (:func:`load_pair` / :func:`make_pair`).
        prompt_ids: the prompt's token ids (at least one).
        config: the run configuration (rule, params, K, sampling, seed, ...).
        request_id: the request key; it keys the coupled random stream (THEORY §4).
        timing: measure ``draft_s`` / ``verify_s`` (synchronises CUDA when on).
        stops: the task's decode-time stop strings (:mod:`~relaxspec_audit.collect.stops`).
        **engine_kw: :class:`BatchedEngine`'s options (``adapter``, ``rule_fn``).

    Returns:
        ``positions``, ``rounds`` and the ``requests`` row (without item, task, split,
        text and score, which :func:`collect` adds).
    """
    requests = [(request_id, list(prompt_ids))]
    (rows,) = decode_batched(pair, requests, config, 1, timing=timing, stops=stops, **engine_kw)
    return rows
