"""Batched collection: B requests per target pass, each row at its own positions.

The speculative round of :mod:`relaxspec_audit.collect.engine`, for ``B`` rows at once
over :class:`~relaxspec_audit.collect.fastmodel.FastLM`'s static KV caches (one for the
target, one for the draft). Shapes are fixed for a given width: every row drafts ``K``
tokens and the target verifies ``[last emitted, x_1..x_K]`` (``K + 1`` slots) in one
``[B, K + 1]`` pass; an idle row pads every slot to the scratch position. A row's block
still ends at its draft EOS or its length limit: ``Block.lengths`` decides it exactly as
the shorter block the one-request engine verifies (THEORY §2, property-tested), so the rows
it logs are the same rows. Continuous batching: a row that finishes (EOS, length limit) is
handed to the sink and refilled with the next request; refilled rows are prefilled
together. Once every request is admitted, the batch halves while at most half its rows are
live (live rows move into the first slots, :meth:`BatchedEngine._narrow`), so a draining
run's tail does not pay for idle rows.

Cache invariant (per row, as in the one-request engine): between rounds the target cache
holds every token of ``prompt + output`` but the last; the draft cache holds the same, or
one token fewer when all ``K`` drafts were accepted (it never ran on ``x_K``). Rollback is
implicit: a row continues from its own position and stale K/V beyond it are overwritten
before anything attends to them (:mod:`~relaxspec_audit.collect.fastmodel`).

A request's log does not depend on its batch-mates in what is drawn: every uniform is keyed
by ``(seed, request, absolute position, purpose)`` (THEORY §4). Float results do depend on
the batch (a row's matmul differs between 1, 2 and ≥ 5 rows), so logs at different batch
sizes agree in floats within a tolerance and in decisions up to the first near-tie
(THEORY §4; tests/collect/test_batched.py checks that contract).

Per round the host receives the drafts, the accepted lengths, the emitted tokens and the
ASD ledgers of all rows in one copy; the uniforms of all rows go to the device in one copy.
Logging is the one-request engine's (:class:`~relaxspec_audit.collect.roundlog._RoundLog`
per row, batched over rounds); a row's ``draft_s`` / ``verify_s`` are its batch's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig
from relaxspec_audit.collect.engine import _Timer, cut_emitted, guard_logits, nonfinite_error
from relaxspec_audit.collect.fastmodel import FastLM, supports
from relaxspec_audit.collect.graphs import GraphedLM
from relaxspec_audit.collect.logs import RequestRows, output_sha256
from relaxspec_audit.collect.pair import DecodeError, Pair
from relaxspec_audit.collect.roundlog import (
    RoundOutcome,
    RoundRecord,
    RoundTensors,
    _RoundLog,
    _rounds,
    _TokenLog,
    flush_together,
)
from relaxspec_audit.collect.sampling import _host_uniforms, transform_logits
from relaxspec_audit.collect.stops import StopStrings
from relaxspec_audit.verify import rng
from relaxspec_audit.verify.block import Block

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


def fast_path_reason(pair: Pair) -> str | None:
    """Why ``pair`` cannot use the batched static-cache engine (None when it can)."""
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            continue
        reason = supports(model)
        if reason is not None:
            return f"{role}: {reason}"
    return None


def resolve_batch_size(batch_size: int | None, device: torch.device, n_requests: int) -> int:
    """``batch_size``, or the automatic choice for ``device`` (:data:`AUTO_BATCH`).

    Never more rows than requests: an idle row costs as much as a busy one.
    """
    b = batch_size if batch_size is not None else AUTO_BATCH.get(device.type, AUTO_BATCH["cpu"])
    return max(1, min(b, n_requests))


def kv_bytes(pair: Pair, batch_size: int, max_seq_len: int) -> int:
    """Bytes of the static KV caches (target and draft) for a batch (nothing allocated)."""
    total = 0
    for model in (pair.target, pair.draft):
        if model is not None:
            total += FastLM(model).cache_bytes(batch_size, max_seq_len)
    return total


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


def check_kv_fits(pair: Pair, batch_size: int, max_seq_len: int) -> int:
    """The KV caches' bytes; raise before any allocation when they cannot fit.

    Raises:
        DecodeError: naming the batch size, the sequence length, the cache size and the
            free memory of the device.
    """
    need = kv_bytes(pair, batch_size, max_seq_len)
    free = _free_bytes(pair.device)
    # Keep half the free memory for weights' activations, logits and the logs' tensors.
    if free is not None and need > free // 2:
        raise DecodeError(
            f"batch_size {batch_size} × max_seq_len {max_seq_len}: the KV caches need "
            f"{need / 2**20:.1f} MiB, more than half of the {free / 2**20:.1f} MiB free on "
            f"{pair.device}; lower --batch-size or max_new_tokens"
        )
    return need


@dataclass
class _Row:
    """One request in flight in one row of the batch (host state)."""

    request_id: str
    prompt: list[int]
    seq: list[int]  # prompt + output
    u_all: np.ndarray  # [3, N+K+1] the request's uniforms (draft, accept, sample)
    t_start: float
    log: Any = None  # _RoundLog | _TokenLog | None
    d_lack: list[int] = field(default_factory=list)  # tokens the draft cache lacks
    rounds: list[RoundRecord] = field(default_factory=list)
    passes: int = 0
    stop: str = "length"

    @property
    def n_out(self) -> int:
        return len(self.seq) - len(self.prompt)


class BatchedEngine:
    """Decode many requests of one run, ``batch_size`` rows at a time (continuous batching).

    Build once per run (it allocates the KV caches for ``max_prompt`` + ``max_new_tokens``)
    and call :meth:`run`. Only for pairs :func:`fast_path_reason` accepts. ``narrow``:
    halve the batch while at most half its rows are live once every request has been
    admitted (:meth:`_narrow`; off only to measure what it saves).
    """

    def __init__(
        self,
        pair: Pair,
        config: RunConfig,
        batch_size: int,
        max_prompt: int,
        stops: StopStrings | None = None,
        narrow: bool = True,
    ) -> None:
        reason = fast_path_reason(pair)
        if reason is not None:
            raise DecodeError(f"the batched engine cannot serve this pair: {reason}")
        self.pair, self.config, self.b, self.stops = pair, config, batch_size, stops
        self.narrow = narrow
        self.widths: list[int] = []  # the widths the batch narrowed to, in order
        self.k = 0 if config.rule == TARGET_ONLY else config.k
        # Positions a row can reach: prompt + output + the K drafts of the last round.
        self.s_max = max_prompt + config.max_new_tokens + self.k + 1
        self.kv_bytes = check_kv_fits(pair, batch_size, self.s_max)
        self.kv_block = KV_BLOCK  # attention windows round up to this (S_max or more: none)
        self.target = FastLM.from_hf(pair.target)
        self.target.setup_cache(batch_size, self.s_max)
        self.draft = None
        self._state: torch.Tensor | None = None  # [B] per-row rule state (the ASD ledger)
        if self.k:
            if pair.draft is None:
                raise DecodeError(f"rule {config.rule!r} needs a draft model; the pair has none")
            self.draft = FastLM.from_hf(pair.draft)
            self.draft.setup_cache(batch_size, self.s_max)
        # The fixed-shape calls of a round (draft steps, verify, target-only steps); prefill
        # stays eager. Graphs replay the same kernels as the eager calls.
        self.graphs = config.cuda_graphs
        if self.graphs and pair.device.type != "cuda":
            raise DecodeError(f"cuda_graphs needs a CUDA device; the pair is on {pair.device}")
        self._target_call = GraphedLM(self.target) if self.graphs else self.target
        self._draft_call = (
            GraphedLM(self.draft) if self.graphs and self.draft is not None else self.draft
        )

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
        rows: list[_Row | None] = [None] * self.b
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
                finished = self._round(rows, timing) if self.k else self._step(rows, timing)
                done = [self._finish(rows[slot]) for slot in finished]
            for slot in finished:
                rows[slot] = None
            yield from done

    def _narrow(self, rows: list[_Row | None]) -> list[_Row | None]:
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

    def _prefill(self, slots: list[int], rows: list[_Row | None]) -> None:
        """Prefill the prompts of the rows just admitted, all in one padded pass per model.

        Each row's cache gets all of its prompt but the last token (the first round feeds
        that one). Prefilling the refilled rows together, not one by one, matters once
        prompts are long: the pass is compute-bound, and one ``[n, L]`` call costs little
        more than one ``[1, L]`` call on a GPU and far less than n of them on a CPU.
        """
        slots = [s for s in slots if len(rows[s].prompt) > 1]
        if not slots:
            return
        dev, scratch = self.pair.device, self.s_max
        width = max(len(rows[s].prompt) - 1 for s in slots)
        ids = torch.zeros(len(slots), width, dtype=torch.long)  # [n, L], pads: any id
        pos = torch.full((len(slots), width), scratch, dtype=torch.long)  # [n, L]
        for j, s in enumerate(slots):
            head = rows[s].prompt[:-1]
            ids[j, : len(head)] = torch.tensor(head)
            pos[j, : len(head)] = torch.arange(len(head))
        ids, pos = ids.to(dev), pos.to(dev)
        which = torch.tensor(slots, device=dev)
        for model in (self.target, self.draft):
            if model is not None:
                model(ids, pos, rows=which, keep=1, kv_len=self._window(width))

    def _window(self, n: int) -> int:
        """The ``kv_len`` of a call whose positions are all below ``n``: ``n`` rounded up."""
        return min(-(-n // self.kv_block) * self.kv_block, self.s_max)

    def _admit(self, request: tuple[str, list[int]] | None) -> _Row | None:
        """A row for the next request (its prompt is prefilled by :meth:`_prefill`)."""
        if request is None:
            return None
        request_id, prompt = request
        if not prompt:
            raise DecodeError(f"request {request_id}: empty prompt (no token ids)")
        cfg = self.config
        key = rng.request_key(request_id)
        n_u = cfg.max_new_tokens + self.k + 1
        row = _Row(request_id, list(prompt), list(prompt), _host_uniforms(cfg, key, 0, n_u),
                   time.perf_counter())  # fmt: skip
        row.d_lack = [prompt[-1]]
        if cfg.log_positions:
            v = self.pair.vocab_size
            if self.k:
                spec = cfg.spec
                theta = spec.nucleus_theta(cfg.params)
                row.log = _RoundLog(self.k, v, theta, list(cfg.theta_grid), row.u_all,
                                    share=self.b, auto_flush=False)  # fmt: skip
            else:
                row.log = _TokenLog(v, cfg.greedy, len(cfg.theta_grid))
        return row

    def _finish(self, row: _Row) -> RequestRows:
        out = row.seq[len(row.prompt) :]
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

    # ------------------------------------------------------------------ one speculative round

    def _round(self, rows: list[_Row | None], timing: bool) -> list[int]:
        """One round for every row; returns the slots whose request finished."""
        cfg, dev, v, k, b = self.config, self.pair.device, self.pair.vocab_size, self.k, len(rows)
        scratch = self.s_max
        timer = _Timer(dev, timing)
        live = [i for i, r in enumerate(rows) if r is not None]
        # Host layout of the round: positions, tokens the draft lacks, uniforms.
        n_len = np.zeros(b, dtype=np.int64)  # L: len(prompt + output) per row
        feed_ids = np.zeros((b, 2), dtype=np.int64)
        feed_pos = np.full((b, 2), scratch, dtype=np.int64)
        u = np.zeros((b, 3, k + 1))  # [B, 3, K+1]
        for i in live:
            r = rows[i]
            n_len[i] = len(r.seq)
            lack = r.d_lack
            feed_ids[i, 2 - len(lack) :] = lack
            feed_pos[i, 2 - len(lack) :] = np.arange(n_len[i] - len(lack), n_len[i])
            start = r.n_out
            u[i] = r.u_all[:, start : start + k + 1]
        u_dev = torch.from_numpy(u).to(dev)  # [B, 3, K+1], one transfer for all rows
        live_dev = torch.zeros(b, dtype=torch.bool)
        live_dev[live] = True
        live_dev = live_dev.to(dev)
        base = torch.from_numpy(n_len).to(dev)  # [B]
        kv = self._window(int(n_len[live].max()) + k)  # verify's last position: L + K - 1
        t0 = timer.now()
        # --- draft: K tokens for every row (fixed shapes); the first call feeds what each
        # row's draft cache lacks (1 or 2 tokens, left-padded to 2 with the scratch slot).
        ids = torch.from_numpy(feed_ids).to(dev)  # [B, 2]
        pos = torch.from_numpy(feed_pos).to(dev)  # [B, 2]
        idle = torch.full_like(pos, scratch)
        drafts, q_rows, d_bad = [], [], []
        for i in range(k):
            logits = self._draft_call(ids, pos, keep=1, kv_len=kv)[:, -1, :v].float()  # [B, V]
            logits, bad = guard_logits(logits)  # [B, V], [B]: read with the round's copy
            d_bad.append(bad)
            q_i = transform_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)  # [B, V]
            if cfg.greedy:
                x_i = logits.argmax(-1)  # [B]
            else:
                x_i = rng.sample_icdf(q_i, u_dev[:, 0, i])  # [B]
            drafts.append(x_i)
            q_rows.append(q_i)
            ids = x_i[:, None]  # [B, 1]
            pos = torch.where(live_dev[:, None], (base + i)[:, None], idle[:, :1])
        drafts_t = torch.stack(drafts, 1)  # [B, K]
        q = torch.stack(q_rows, 1)  # [B, K, V]
        # A row's block ends at its first draft EOS or its length limit: nothing after
        # either can be emitted (the one-request engine stops drafting there).
        eos = list(self.pair.eos_ids)
        if eos:
            is_eos = torch.isin(drafts_t, torch.tensor(eos, device=dev))  # [B, K]
            first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, k)  # [B]
        else:
            first = torch.full((b,), k, device=dev)
        cap = torch.from_numpy(np.maximum(cfg.max_new_tokens - (n_len - _prompt_lens(rows)), 1))
        lengths_t = torch.minimum(first, cap.to(dev)).to(torch.int64)  # [B]
        t1 = timer.now()
        # --- verify: [last emitted, x_1..x_K] at positions L-1 .. L+K-1, one target pass.
        last = torch.from_numpy(np.array([r.seq[-1] if r else 0 for r in rows])).to(dev)  # [B]
        t_ids = torch.cat([last[:, None], drafts_t], 1)  # [B, K+1]
        t_pos = (base - 1)[:, None] + torch.arange(k + 1, device=dev)[None]  # [B, K+1]
        t_pos = torch.where(live_dev[:, None], t_pos, torch.full_like(t_pos, scratch))
        z = self._target_call(t_ids, t_pos, kv_len=kv)[..., :v].float()  # [B, K+1, V]
        z, t_bad = guard_logits(z)  # [B, K+1, V], [B, K+1]
        # Only what the one-request engine computes counts: live rows, their block's drafts
        # and its k_r + 1 target rows (idle rows and slots past a block's end are padding).
        slot = torch.arange(k + 1, device=dev)[None]  # [1, K+1]
        d_bad_t = torch.stack(d_bad, 1) & (slot[:, :k] < lengths_t[:, None]) & live_dev[:, None]
        t_bad = t_bad & (slot <= lengths_t[:, None]) & live_dev[:, None]  # [B, K+1]
        bad_any = (d_bad_t.any() | t_bad.any()).view(1)  # [1]
        p = transform_logits(z, cfg.temperature, cfg.top_k, cfg.top_p)  # [B, K+1, V]
        block = Block(
            drafts=drafts_t,
            p=p,
            q=q,
            target_logits=z,
            u_accept=u_dev[:, 1, :k],  # float64, as the one-request engine's
            u_sample=u_dev[:, 2, : k + 1],
            greedy=cfg.greedy,
            k_nominal=k,
            diagnostics=False,
            lengths=lengths_t,
        )
        res = cfg.spec.fn(block, cfg.params, self._state)
        self._state = res.state
        spent = (
            res.state.to(torch.float64)
            if res.state is not None
            else torch.full((b,), math.nan, dtype=torch.float64, device=dev)
        )
        # One device → host copy for every row: drafts, lengths, accepted, token, ledger.
        host = torch.cat(
            [drafts_t.double().flatten(), lengths_t.double(), res.accepted.double(),
             res.token.double(), spent, bad_any.double()]
        ).cpu().numpy()  # fmt: skip
        t2 = timer.now()
        if host[-1]:  # before anything of the round is emitted or logged
            self._raise_nonfinite(rows, d_bad_t.cpu().numpy(), t_bad.cpu().numpy())
        x_host = host[: b * k].reshape(b, k).astype(np.int64)
        k_r, a_h, y_h, s_h = (host[b * k + j * b : b * k + (j + 1) * b] for j in range(4))
        finished = []
        for i in live:
            r = rows[i]
            kr, a, y = int(k_r[i]), int(a_h[i]), int(y_h[i])
            start = r.n_out
            emitted = [*x_host[i, :a].tolist(), y]
            m = min(len(emitted), cfg.max_new_tokens - start)
            m, r.stop = cut_emitted(emitted, m, r.stop, self.pair.eos_ids, self.stops,
                                    r.seq[len(r.prompt) :])  # fmt: skip
            truncated = m < len(emitted)
            if r.log is not None:
                r.log.add(
                    RoundTensors.of_row(p, q, z, drafts_t, res, i, kr),
                    RoundOutcome(start, x_host[i, :kr], a, y, m if truncated else kr,
                                 not truncated),
                )  # fmt: skip
            r.seq.extend(emitted[:m])
            r.passes += 1
            spent_row = None if res.state is None else float(s_h[i])
            r.rounds.append(RoundRecord(len(r.rounds), start, kr, m if truncated else a, m,
                                        t1 - t0, t2 - t1, spent_row))  # fmt: skip
            if r.stop != "length" or truncated or r.n_out >= cfg.max_new_tokens:
                finished.append(i)
                if res.state is not None:  # the next request in this row starts at 0
                    self._state = self._state.index_fill(0, torch.tensor([i], device=dev), 0.0)
            else:
                r.d_lack = [int(x_host[i, k - 1]), y] if a == k else [y]
        # Logging: when one row's log is due, flush every row's together (one token_stats,
        # one E_S grid, one host copy for the batch); finished rows flush in _finish.
        logs = [rows[i].log for i in live if rows[i].log is not None and i not in finished]
        if any(len(log.pending) >= log.n_flush for log in logs):
            flush_together(logs)
        return finished

    def _raise_nonfinite(self, rows: list[_Row | None], d_bad: Any, t_bad: Any) -> None:
        """Raise for the first row with non-finite logits.

        Args:
            rows: the batch's rows.
            d_bad: ``[B, K]`` flags of the draft steps (None for target-only decoding).
            t_bad: ``[B, K+1]`` flags of the target's rows (``[B, 1]`` target-only).
        """
        for i, r in enumerate(rows):
            d_row = None if d_bad is None else d_bad[i]
            if r is not None and (t_bad[i].any() or (d_row is not None and d_row.any())):
                raise nonfinite_error(r.request_id, r.n_out, len(r.prompt), d_row, t_bad[i])

    # ------------------------------------------------------------------ target-only step

    def _step(self, rows: list[_Row | None], timing: bool) -> list[int]:
        """One target-only token for every row; returns the slots whose request finished."""
        cfg, dev, v, b = self.config, self.pair.device, self.pair.vocab_size, len(rows)
        timer = _Timer(dev, timing)
        live = [i for i, r in enumerate(rows) if r is not None]
        ids = np.zeros((b, 1), dtype=np.int64)
        pos = np.full((b, 1), self.s_max, dtype=np.int64)
        u = np.zeros(b)
        for i in live:
            r = rows[i]
            ids[i, 0], pos[i, 0] = r.seq[-1], len(r.seq) - 1
            u[i] = r.u_all[2, r.n_out]
        kv = self._window(max(len(rows[i].seq) for i in live))
        t0 = timer.now()
        z = self._target_call(
            torch.from_numpy(ids).to(dev), torch.from_numpy(pos).to(dev), kv_len=kv
        )
        z, bad = guard_logits(z[:, -1, :v].float())  # [B, V], [B]
        p = None
        if cfg.greedy:
            y = z.argmax(-1)  # [B]
        else:
            p = transform_logits(z, cfg.temperature, cfg.top_k, cfg.top_p)  # [B, V]
            y = rng.sample_icdf(p, torch.from_numpy(u).to(dev))  # [B]
        host = torch.cat([y, bad.long()]).cpu().numpy()  # one host read per step, every row
        y_host, bad_host = host[:b], host[b:].astype(bool)
        if bad_host[live].any():
            live_mask = np.zeros(b, dtype=bool)
            live_mask[live] = True
            self._raise_nonfinite(rows, None, (bad_host & live_mask)[:, None])
        t1 = timer.now()
        finished = []
        for i in live:
            r = rows[i]
            tok = int(y_host[i])
            if r.log is not None:
                r.log.add(z[i : i + 1], None if p is None else p[i : i + 1], y[i : i + 1])
            r.rounds.append(RoundRecord(r.n_out, r.n_out, 0, 0, 1, 0.0, t1 - t0, None))
            _, r.stop = cut_emitted([tok], 1, r.stop, self.pair.eos_ids, self.stops,
                                    r.seq[len(r.prompt) :])  # fmt: skip
            r.seq.append(tok)
            r.passes += 1
            if r.stop != "length" or r.n_out >= cfg.max_new_tokens:
                finished.append(i)
        return finished


def _prompt_lens(rows: list[_Row | None]) -> np.ndarray:
    return np.array([len(r.prompt) if r else 0 for r in rows], dtype=np.int64)


def decode_batched(
    pair: Pair,
    requests: list[tuple[str, list[int]]],
    config: RunConfig,
    batch_size: int | None = None,
    *,
    timing: bool = True,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    stops: StopStrings | None = None,
    narrow: bool = True,
) -> Iterator[RequestRows]:
    """Decode ``requests`` batched; yield each one's rows as it finishes.

    Args:
        pair: a pair the static-cache path serves (:func:`fast_path_reason` is None).
        requests: ``(request_id, prompt_ids)`` pairs.
        config: the run configuration.
        batch_size: rows per target pass (None: :data:`AUTO_BATCH` for the device).
        timing: measure ``draft_s`` / ``verify_s``.
        on_start: called once, before decoding, with the engine's record
            (:func:`engine_info`).
        stops: the task's decode-time stop strings.
        narrow: halve the batch as it drains (:meth:`BatchedEngine._narrow`).
    """
    if not requests:
        return
    b = resolve_batch_size(batch_size, pair.device, len(requests))
    longest = max(len(ids) for _, ids in requests)
    engine = BatchedEngine(pair, config, b, longest, stops, narrow=narrow)
    if on_start is not None:
        on_start(engine_info(engine))
    yield from engine.run(requests, timing=timing)


def engine_info(engine: BatchedEngine) -> dict[str, Any]:
    """What the manifest records of the engine that ran."""
    return {
        "engine": "static",
        "batch_size": engine.b,
        "max_seq_len": engine.s_max,
        "kv_cache_bytes": engine.kv_bytes,
        "cuda_graphs": engine.graphs,
        "narrowing": engine.narrow,
    }
