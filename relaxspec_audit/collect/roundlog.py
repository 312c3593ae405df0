"""Log rows of one request, computed in batches off the per-round path.

The decode loop copies to the host only what decoding needs. With logging on, each round
hands :class:`_RoundLog` references to its device tensors (:class:`RoundTensors`: p, q,
the target logits, the drafts and the rule's decisions) and the host integers it already
read (:class:`RoundOutcome`); no copy, no host sync. The log computes the per-position
statistics (``rules.token_stats`` of drafts and emitted tokens, ``E_S`` on the θ grid,
THEORY §2.3) batched over up to ``_FLUSH_MAX_ROUNDS`` rounds, copies them to the host in one
transfer per batch and builds the ``positions`` rows with numpy at the end of the request
(docs/ARCHITECTURE.md "Logs"). So the logging cost is a few batched kernels per request,
not per round. :class:`_TokenLog` does the same for target-only decoding, and
:class:`RoundRecord` is one row of the ``rounds`` table.

The rows equal a per-round computation's (each statistic is a reduction over one row of
V), which tests/collect/test_decoder.py checks against the rule's own full diagnostics.

torch is imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from relaxspec_audit.collect.sampling import transform_logits
from relaxspec_audit.verify.block import TOKEN_STAT_KEYS, Cause
from relaxspec_audit.verify.diagnostics import es_grid, token_stats
from relaxspec_audit.verify.params import DEFAULT_THETA

if TYPE_CHECKING:
    import torch

# Diagnostics of draft rows that come from the rule's decision (BlockResult.diag); every
# other column of a position row is rules.token_stats, computed by _RoundLog off the round.
_RULE_KEYS = ("passed_ratio", "accepted", "cause")
# token_stats of any logged token (drafts, recovery, bonus), in transfer order.
_STAT_KEYS = TOKEN_STAT_KEYS
_INT_COLS = ("rank", "target_argmax")
# The host layout of token_stats in _RoundLog: float keys, then the integer/bool keys.
_INT_STATS = ("rank", "target_argmax", "in_nucleus")
# logp_target: log of the untransformed target distribution (softmax of the raw logits at
# T = 1, no top-k/top-p) at the row's token, the open-ended fidelity measure's input
# (audit/likelihood.py); every row kind, both logs. It is not a rule statistic, so it is
# computed beside token_stats rather than inside it.
_LOGP_KEY = "logp_target"
_HOST_FLOATS = (*(c for c in _STAT_KEYS if c not in _INT_STATS), _LOGP_KEY)
_HOST_STATS = _HOST_FLOATS + _INT_STATS
_BOOL_COLS = ("passed_ratio", "in_nucleus", "accepted")
# _RoundLog keeps p, q and the target logits of pending rounds alive (about (3K + 2)·V
# floats per round) and flushes when that would pass this many floats (64 MB in float32)
# or _FLUSH_MAX_ROUNDS rounds.
_FLUSH_FLOATS = 1 << 24
_FLUSH_MAX_ROUNDS = 64
_CPU_CHUNK = 1 << 17  # elements per token_stats call on CPU (see _RoundLog._flush)


class RoundTensors(NamedTuple):
    """Device tensors of one round of ``k_r ≤ K`` drafts, handed over by reference."""

    p: torch.Tensor  # [k_r+1, V] float32 target probs after the sampling transform
    q: torch.Tensor  # [k_r, V] float32 draft probs the drafts were sampled from
    z: torch.Tensor  # [k_r+1, V] float32 raw target logits
    drafts: torch.Tensor  # [k_r] int64 draft tokens x_1..x_{k_r}
    token: torch.Tensor  # [1] int64 the emitted recovery (a < k_r) or bonus token
    decisions: list[torch.Tensor]  # _RULE_KEYS of the rule's BlockResult.diag, each [k_r]

    @classmethod
    def of_row(
        cls,
        p: torch.Tensor,
        q: torch.Tensor,
        z: torch.Tensor,
        drafts: torch.Tensor,
        res: Any,
        row: int,
        k_r: int,
    ) -> RoundTensors:
        """Row ``row`` of a batched round whose block for that row ends at ``k_r`` drafts."""
        decisions = [res.diag[key][row, :k_r] for key in _RULE_KEYS]  # each [k_r]
        token = res.token[row : row + 1]  # [1]
        return cls(p[row, : k_r + 1], q[row, :k_r], z[row, : k_r + 1], drafts[row, :k_r],
                   token, decisions)  # fmt: skip


class RoundOutcome(NamedTuple):
    """Host values of one round, read in its one device → host copy."""

    start: int  # abs_pos of x_1
    drafts: np.ndarray  # [k_r] int64 draft tokens
    accepted: int  # a: length of the accepted prefix
    token: int  # y: the emitted recovery or bonus token
    n_draft_rows: int  # draft rows to log: k_r, or the emitted count of a truncated round
    emit: bool  # log the recovery/bonus row (False when the round was truncated)


class RoundRecord(NamedTuple):
    """One row of the ``rounds`` table (field names are its columns, ``logs.SCHEMA``)."""

    round: int
    start_pos: int  # abs_pos of the round's first verified position
    k: int  # drafts made this round (k_r; 0 for target-only)
    accepted: int  # accepted drafts logged (the emitted count when truncated)
    emitted: int
    draft_s: float
    verify_s: float
    spent: float | None  # ASD ledger after the round; None unless the rule keeps state


def es_grid_topm(p: torch.Tensor, q: torch.Tensor, grid: list[float], m: int = 32) -> np.ndarray:
    """``rules.es_grid`` computed on each row's top tokens, exact, on the host.

    A token can only be in a nucleus ``N_θ`` (θ ≤ max grid) if the mass ranked before it is
    below θ. When the mass of the top-m tokens strictly above the m-th probability reaches
    max θ, no token outside the top m (and none tied with the m-th) is in any nucleus of
    the grid, and every nucleus member's ``mass_above`` is the same inside the top m as in
    the whole vocabulary: E_S is exact. Rows where that fails (flatter p) are retried with
    4× more tokens, and finally on the full vocabulary. This replaces a sort over V per
    position (the cost of E_S) by a top-k for the usual peaked rows.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities.
        grid: θ values in (0, 1].
        m: tokens kept per row in the first stage (then 4m, 16m, ... while below V/4).

    Returns:
        ``[..., G]`` float32 numpy array, E_S at each θ.
    """
    import torch

    v = p.shape[-1]
    lead = p.shape[:-1]
    p2, q2 = p.reshape(-1, v), q.reshape(-1, v)  # [N, V]
    out = np.full((p2.shape[0], len(grid)), np.nan, dtype=np.float32)
    todo = np.arange(p2.shape[0])
    while 4 * m < v and max(grid) < 1.0 and todo.size:
        if todo.size == p2.shape[0]:
            pr, qr = p2, q2
        else:
            rows = torch.from_numpy(todo).to(p.device)
            pr, qr = p2[rows], q2[rows]  # [n, V]
        top_p, idx = torch.topk(pr, m, dim=-1)  # [n, m], descending
        idx = idx.sort(dim=-1).values  # id order: es_grid's stable sort breaks ties by id
        t = top_p[:, -1:]  # [n, 1] the m-th probability
        above = torch.where(top_p > t, top_p.double(), 0.0).sum(-1)  # [n] mass above t
        es = es_grid(pr.gather(-1, idx), qr.gather(-1, idx), grid)  # [n, G]
        both = torch.cat([es.double(), above.unsqueeze(-1)], -1).cpu().numpy()  # one copy
        safe = both[:, -1] >= max(grid)
        out[todo[safe]] = both[safe, :-1]
        todo = todo[~safe]
        m *= 4
    if todo.size == p2.shape[0]:
        out = es_grid(p2, q2, grid).cpu().numpy()
    elif todo.size:
        rows = torch.from_numpy(todo).to(p.device)
        out[todo] = es_grid(p2[rows], q2[rows], grid).cpu().numpy()
    return out.reshape(*lead, len(grid))


def _host_token_stats(
    p: torch.Tensor,
    q: torch.Tensor | None,
    z: torch.Tensor,
    x: torch.Tensor,
    theta: float,
    extra: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``rules.token_stats`` of N rows ``[N, V]`` on the host, in one device → host copy.

    On CPU the rows go in chunks of about ``_CPU_CHUNK`` elements, so the full-size
    temporaries of each chunk stay in cache (about 1.5x faster at V = 4096); one call on a
    GPU. ``extra`` (any shape, exact in float64) travels in the same copy.

    Returns:
        ``[len(_HOST_STATS), N]`` float64 statistics in ``_HOST_STATS`` order, and the
        flattened ``extra`` (empty without it).
    """
    import torch

    n = p.shape[0]
    step = n if p.is_cuda else max(1, _CPU_CHUNK // p.shape[-1])
    parts = [
        token_stats(p[i : i + step], None if q is None else q[i : i + step],
                          z[i : i + step], x[i : i + step], theta)
        for i in range(0, n, step)
    ]  # fmt: skip
    st = {c: torch.cat([part[c] for part in parts]) for c in _STAT_KEYS}  # each [N]
    st[_LOGP_KEY] = torch.cat([_logp(z[i : i + step], x[i : i + step]) for i in range(0, n, step)])
    floats = torch.stack([st[c] for c in _HOST_FLOATS])
    ints = torch.stack([st[c] for c in _INT_STATS])  # int64 (bool promoted)
    # float64 holds every token id and rank exactly
    pieces = [floats.double().reshape(-1), ints.reshape(-1)]
    if extra is not None:
        pieces.append(extra.reshape(-1))
    host = torch.cat(pieces).cpu().numpy()
    n_s = len(_HOST_STATS)
    return host[: n_s * n].reshape(n_s, n), host[n_s * n :]


def _logp(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``log softmax(z)[x]`` per row, at temperature 1 (``z`` raw logits ``[N, V]``, ``x`` ``[N]``).

    One gather and one logsumexp on the device, never a full ``[N, V]`` log-softmax; the
    value travels to the host in the statistics' one copy.
    """
    import torch

    z = z.float()
    return z.gather(-1, x.view(-1, 1).long()).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _pad_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` with its last row repeated along dim 0 up to ``n`` rows."""
    import torch

    return torch.cat([t, t[-1:].expand(n - t.shape[0], *t.shape[1:])])


class _RoundLog:
    """Position rows of one speculative request, computed off the per-round path.

    A round only hands over references to its device tensors (:class:`RoundTensors`) and
    the host values it already has (:class:`RoundOutcome`). Once ``n_flush`` rounds are
    pending (and at the end) one ``rules.token_stats`` over all pending drafts and emitted
    tokens and one ``E_S`` grid run (:func:`es_grid_topm`) go to the host, for every row of
    the batch together (:func:`flush_together`); the host rows of every round are then
    built with numpy in one pass (:meth:`columns`).
    """

    def __init__(
        self,
        k: int,
        v: int,
        theta: float,
        grid: list[float],
        u_all: np.ndarray,
        share: int = 1,
    ):
        self.k, self.theta, self.grid = k, theta, grid
        self.u_all = u_all  # [3, N+K+1] the request's uniforms (draft, accept, sample)
        # `share` logs hold views of one batched round's tensors: split the budget among them.
        budget = _FLUSH_FLOATS // max(1, share)
        # Due every n_flush rounds; the engine then flushes all its rows' logs together
        # (flush_together): one token_stats, one E_S grid and one host copy for the batch.
        self.n_flush = max(1, min(_FLUSH_MAX_ROUNDS, budget // ((3 * k + 2) * v)))
        self.pending: list[RoundTensors] = []  # rounds not yet flushed, padded to K
        self.rounds: list[RoundOutcome] = []  # every round, drafts padded to K
        self.k_r: list[int] = []  # drafts made per round
        self.stats: list[np.ndarray] = []  # per flush [R, S] (layout: _flush)
        self.es: list[np.ndarray] = []  # per flush [R, K, G]

    def add(self, tensors: RoundTensors, outcome: RoundOutcome) -> None:
        """Keep one round of ``k_r ≤ K`` drafts for the next flush.

        A short round is padded to K by repeating its last row; the padding is never logged
        (rows ≤ k_r).
        """
        k, k_r = self.k, tensors.drafts.shape[0]
        if k_r < k:
            p, q, z, drafts, token, decisions = tensors
            tensors = RoundTensors(
                _pad_rows(p, k + 1),
                _pad_rows(q, k),
                _pad_rows(z, k + 1),
                _pad_rows(drafts, k),
                token,
                [_pad_rows(d, k) for d in decisions],
            )
            outcome = outcome._replace(drafts=np.pad(outcome.drafts, (0, k - k_r), mode="edge"))
        self.pending.append(tensors)
        self.rounds.append(outcome)
        self.k_r.append(k_r)

    def _flush(self) -> None:
        flush_together([self])

    def _pending_rows(self) -> tuple[Any, ...]:
        """This log's pending rounds as token rows: the R·K drafts, then the R emitted."""
        import torch

        k, pend = self.k, self.pending
        a = [r.accepted for r in self.rounds[-len(pend) :]]
        # One copy per tensor; a bonus row's q is a stand-in, ignored on the host.
        emit = list(zip(pend, a, strict=True))
        p = torch.cat([r.p[:k] for r in pend] + [r.p[ai : ai + 1] for r, ai in emit])
        q = torch.cat([r.q for r in pend] + [r.q[min(ai, k - 1)][None] for r, ai in emit])
        z = torch.cat([r.z[:k] for r in pend] + [r.z[ai : ai + 1] for r, ai in emit])
        x = torch.cat([r.drafts for r in pend] + [r.token for r in pend])  # [R·K + R]
        decisions = torch.stack([d for r in pend for d in r.decisions])  # [3R, K] int64
        return p, q, z, x, decisions

    def _store(self, st_h: np.ndarray, dec: np.ndarray, es: np.ndarray) -> None:
        """Keep one flush's host results: st_h ``[S, R·K + R]``, dec ``[3R·K]``, es."""
        k, n = self.k, len(self.pending)
        n_s, n_pos = len(_HOST_STATS), n * k
        self.stats.append(
            np.concatenate(
                [
                    st_h[:, :n_pos].reshape(n_s, n, k).transpose(1, 0, 2).reshape(n, -1),
                    dec.reshape(n, 3, k).reshape(n, -1),
                    st_h[:, n_pos:].T,
                ],
                1,
            )
        )  # [R, (S + 3)·K + S]: draft stats, decisions, emitted-token stats
        self.es.append(es.reshape(n, k, -1))  # [R, K, G]
        self.pending.clear()

    def columns(self) -> dict[str, Any]:
        """Columns of the positions table: per round its draft rows, then recovery/bonus."""
        self._flush()
        if not self.rounds:
            return {}
        k, n_s = self.k, len(_HOST_STATS)
        stats = np.concatenate(self.stats)  # [R, S]
        es = np.concatenate(self.es)  # [R, K, G]
        n_r = stats.shape[0]
        start, drafts, a, y, n_rows, emit = (np.array(c) for c in zip(*self.rounds, strict=True))
        k_r = np.array(self.k_r)
        # Slots [R, K+1]: K draft rows, then the emitted row; `keep` drops unlogged slots.
        draft_part = stats[:, : (n_s + 3) * k].reshape(n_r, n_s + 3, k)
        emit_part = stats[:, (n_s + 3) * k :]  # [R, n_s]
        keep = np.concatenate([np.arange(k) < n_rows[:, None], emit[:, None]], 1)
        bonus = a == k_r  # the whole (possibly short) block accepted
        cols: dict[str, Any] = {}
        for i, name in enumerate(_HOST_STATS):
            e = emit_part[:, i].copy()
            if name in ("q", "entropy_q", "tv_pq"):
                e[bonus] = math.nan  # no draft distribution at position K+1
            cols[name] = np.concatenate([draft_part[:, i], e[:, None]], 1)
        for j, name in enumerate(_RULE_KEYS):
            e = np.full((n_r, 1), math.nan)
            if name == "cause":
                e[:, 0] = np.where(bonus, int(Cause.BONUS), int(Cause.RECOVERY))
            cols[name] = np.concatenate([draft_part[:, n_s + j], e], 1)
        kind = np.full((n_r, k + 1), "draft", dtype=object)
        kind[:, k] = np.where(bonus, "bonus", "recovery")
        pos = np.concatenate([np.broadcast_to(np.arange(k), (n_r, k)), a[:, None]], 1)
        abs_draft = start[:, None] + np.arange(k)  # [R, K]
        u = np.concatenate([self.u_all[1][abs_draft], self.u_all[2][start + a][:, None]], 1)
        es_emit = es[np.arange(n_r), np.minimum(a, k - 1)]  # [R, G]
        es_emit[bonus] = math.nan
        cols["es"] = np.concatenate([es, es_emit[:, None]], 1)  # [R, K+1, G]
        cols["token"] = np.concatenate([drafts, y[:, None]], 1)
        cols["pos"] = pos
        cols["u"] = u
        cols["round"] = np.broadcast_to(np.arange(n_r)[:, None], (n_r, k + 1))
        cols["abs_pos"] = start[:, None] + pos
        out = {name: col[keep] for name, col in cols.items()}
        out["kind"] = kind[keep].tolist()
        return _position_columns(out, len(self.grid))


def flush_together(logs: list[_RoundLog]) -> None:
    """Flush the pending rounds of many logs (one per row of a batch) at once.

    One ``token_stats`` over every pending row of every log, one ``E_S`` grid run and one
    device → host copy for the lot, then each log keeps its own slice. All logs share K,
    θ and the θ grid (they are rows of one run).
    """
    import torch

    logs = [log for log in logs if log.pending]
    if not logs:
        return
    parts = [log._pending_rows() for log in logs]
    head = logs[0]
    p, q, z, x = (torch.cat([pt[j] for pt in parts]) for j in range(4))
    decisions = torch.cat([pt[4] for pt in parts])  # [Σ 3R_i, K]
    st_h, dec = _host_token_stats(p, q, z, x, head.theta, extra=decisions)
    # E_S over the draft rows only: each log's block starts with its R_i·K drafts.
    sizes = [pt[0].shape[0] for pt in parts]  # R_i·(K+1) rows per log
    n_drafts = [len(log.pending) * log.k for log in logs]
    starts = np.cumsum([0, *sizes])
    d_rows = torch.cat([torch.arange(s, s + n, device=p.device)
                        for s, n in zip(starts, n_drafts, strict=False)])  # fmt: skip
    es = es_grid_topm(p[d_rows], q[d_rows], head.grid)  # [Σ R_i·K, G]
    dec_starts = np.cumsum([0, *(3 * len(log.pending) * log.k for log in logs)])
    es_starts = np.cumsum([0, *n_drafts])
    for i, log in enumerate(logs):
        log._store(
            st_h[:, starts[i] : starts[i + 1]],
            dec[dec_starts[i] : dec_starts[i + 1]],
            es[es_starts[i] : es_starts[i + 1]],
        )


class _TokenLog:
    """Position rows of a target-only request: one ``bonus`` row per emitted token.

    Batched as in :class:`_RoundLog`: each token's logits (and p when sampling) are kept and
    ``token_stats`` is computed for many tokens at once, one host copy per batch.
    """

    def __init__(self, v: int, greedy: bool, n_grid: int):
        self.greedy, self.n_grid = greedy, n_grid
        self.n_flush = max(1, min(256, _FLUSH_FLOATS // (2 * v)))
        self.pending: list[tuple] = []  # (z [1, V], p [1, V] or None, y [1]) not yet flushed
        self.stats: list[np.ndarray] = []  # [S, n] per flush, _HOST_STATS order

    def add(self, z: torch.Tensor, p: torch.Tensor | None, y: torch.Tensor) -> None:
        """Keep one token: raw logits z ``[1, V]``, p ``[1, V]`` (None when greedy), y ``[1]``."""
        self.pending.append((z, p, y))
        if len(self.pending) >= self.n_flush:
            self._flush()

    def _flush(self) -> None:
        import torch

        if self.pending:
            pending = self.pending
            z_b = torch.cat([e[0] for e in pending])  # [n, V]
            greedy_p = self.greedy  # greedy mode logs softmax(z) at temperature 1
            p_b = transform_logits(z_b, 0.0) if greedy_p else torch.cat([e[1] for e in pending])
            y_b = torch.cat([e[2] for e in pending])
            self.stats.append(_host_token_stats(p_b, None, z_b, y_b, DEFAULT_THETA)[0])
            pending.clear()

    def columns(self, output: list[int], u: np.ndarray) -> dict[str, Any]:
        """Columns of the positions table for the emitted ``output`` and its uniforms ``u``."""
        self._flush()
        n, n_grid = len(output), self.n_grid
        st = np.concatenate(self.stats, 1)  # [S, n]; q, entropy_q, tv_pq are NaN (no draft)
        cols: dict[str, Any] = {name: st[j] for j, name in enumerate(_HOST_STATS)}
        cols.update(
            passed_ratio=np.full(n, math.nan),
            accepted=np.full(n, math.nan),
            cause=np.full(n, float(Cause.BONUS)),
            kind=["bonus"] * n,
            token=np.array(output, dtype=np.int64),
            pos=np.zeros(n, dtype=np.int64),
            u=u[:n],
            es=np.full((n, n_grid), math.nan),
            round=np.arange(n),
            abs_pos=np.arange(n),
        )
        return _position_columns(cols, n_grid)


def _position_columns(cols: dict[str, Any], n_grid: int) -> dict[str, Any]:
    """The positions table's column types from numeric arrays (NaN → null where nullable)."""
    out: dict[str, Any] = {}
    for name, values in cols.items():
        if name == "kind":
            out[name] = values
        elif name == "cause":
            out[name] = [Cause(int(c)).name.lower() for c in values]
        elif name in _BOOL_COLS:
            out[name] = [None if math.isnan(x) else bool(x) for x in values]
        elif name in _INT_COLS or name in ("token", "round", "pos", "abs_pos"):
            out[name] = values.astype(np.int64)
        elif name == "es":
            es = values.reshape(-1, n_grid).astype(np.float32)
            out[name] = [None if np.isnan(r).any() else r.tolist() for r in es]
        else:
            f = values.astype(np.float32)
            out[name] = (
                [None if math.isnan(x) else x for x in f.tolist()] if np.isnan(f).any() else f
            )
    return out


def _rounds(rows: list[RoundRecord]) -> dict[str, Any]:
    """Columns of the ``rounds`` table from its rows."""
    return {name: [getattr(r, name) for r in rows] for name in RoundRecord._fields}
