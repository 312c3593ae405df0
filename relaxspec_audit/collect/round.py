"""The pieces of one decode round, for ``B`` rows at once: plan, draft, verify, decide, read.

One round (THEORY §1): the draft proposes ``K`` tokens autoregressively; the target scores
``[last emitted, x_1..x_K]`` in ONE ``[B, K + 1]`` pass, giving ``p_1..p_{K+1}``; the rule
accepts a prefix of length ``a`` and emits a recovery (``a < K``) or bonus token. Shapes
are fixed: every row drafts ``K`` tokens and an idle row pads every slot to the scratch
position, but a row's block ends at its first draft EOS or its length limit
(:func:`block_lengths`): ``Block.lengths`` decides a row exactly as the shorter block
(THEORY §2, property-tested), so nothing after an EOS or the limit is ever emitted, and
``rounds.k`` records the block's length. Target-only decoding is the same round with
``K = 0``: no drafts, a ``[B, 1]`` target pass, and the token sampled from p.
:meth:`~relaxspec_audit.collect.batched.BatchedEngine._round` composes these pieces.

Cache invariant (per row): between rounds the target cache holds every token of ``prompt +
output`` but the last; the draft cache holds the same, or one token fewer when all ``K``
drafts were accepted (it never ran on ``x_K``): :attr:`Row.d_lack` is what it lacks, fed
at the round's first draft step. Rollback is implicit (the model adapter's contract,
``collect.adapter``): a row continues from its own position.

Randomness is coupled (THEORY §4): every draw is ``rng.uniforms(seed, request, abs_pos,
purpose)`` through the inverse CDF, drawn on the host once per request
(``sampling._host_uniforms``) and sliced per round, so runs of different rules with one
seed share their stream position by position, whatever the batch.

Host traffic per round: the plan goes to the device in one copy of integers and one of
uniforms (:func:`plan_round`); the drafts, block lengths, accepted lengths, emitted tokens,
ASD ledgers and the non-finite flag come back in ONE copy (:func:`read_round`). Nothing of
a round is emitted or logged before that copy has shown every logit finite.

torch is imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from relaxspec_audit.collect.pair import DecodeError
from relaxspec_audit.collect.roundlog import RoundRecord
from relaxspec_audit.collect.sampling import transform_logits
from relaxspec_audit.collect.stops import StopStrings
from relaxspec_audit.verify import rng
from relaxspec_audit.verify.block import Block, BlockResult

if TYPE_CHECKING:
    import torch

    from relaxspec_audit.collect.config import RunConfig

# End a row's block at its first draft EOS (nothing after it can be emitted). Off only in
# the test that checks outputs are unchanged by it.
_END_BLOCK_AT_DRAFT_EOS = True


class Timer:
    """Wall-clock sections; synchronises CUDA only when timing is on."""

    def __init__(self, device: Any, enabled: bool):
        self.cuda = enabled and device.type == "cuda"
        self.enabled = enabled

    def now(self) -> float:
        """Seconds (0.0 when off), after the device's queued work when on CUDA."""
        if not self.enabled:
            return 0.0
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()


@dataclass
class Row:
    """One request in flight in one row of the batch (host state)."""

    request_id: str
    prompt: list[int]
    seq: list[int]  # prompt + output
    u_all: np.ndarray  # [3, N+K+1] the request's uniforms (draft, accept, sample)
    t_start: float
    log: Any = None  # roundlog._RoundLog | roundlog._TokenLog | None
    d_lack: list[int] = field(default_factory=list)  # tokens the draft cache lacks
    rounds: list[RoundRecord] = field(default_factory=list)
    passes: int = 0
    stop: str = "length"

    @property
    def n_out(self) -> int:
        """Tokens emitted so far."""
        return len(self.seq) - len(self.prompt)

    @property
    def output(self) -> list[int]:
        """The emitted tokens."""
        return self.seq[len(self.prompt) :]


# ----------------------------------------------------------------------------- plan


class RoundPlan(NamedTuple):
    """Where every row of a round stands, on the device (built on the host)."""

    live: list[int]  # slots holding a request
    furthest: int  # 1 + the furthest position any call of the round feeds
    ids: torch.Tensor  # [B, 2] what each row's draft cache lacks, left-padded (model device)
    pos: torch.Tensor  # [B, 2] their positions; the scratch slot in padding (pos device)
    last: torch.Tensor  # [B] each row's last emitted token (model device)
    cap: torch.Tensor  # [B] drafts a row may still emit, max_new_tokens - output, >= 1
    is_live: torch.Tensor  # [B] bool
    verify_pos: torch.Tensor  # [B, K+1] L-1 .. L+K-1; the scratch slot for idle rows (pos dev.)
    u: torch.Tensor  # [B, 3, K+1] float64 uniforms at the rows' positions (draft, accept, sample)


# Columns of the plan's integer block: draft feed ids, their positions, last, cap, live,
# then the K + 1 verify positions.
_IDS, _POS, _LAST, _CAP, _LIVE, _VERIFY = slice(0, 2), slice(2, 4), 4, 5, 6, 7


def plan_round(
    rows: list[Row | None],
    k: int,
    scratch: int,
    max_new_tokens: int,
    device: torch.device,
    pos_device: torch.device,
) -> RoundPlan:
    """The round's host layout, copied to the device once (and to ``pos_device`` if apart).

    ``pos_device`` is where the model adapter reads positions (``adapter.CacheLM``: the
    CPU, where it crops its caches; FastLM: the weights' device).
    """
    import torch

    b = len(rows)
    live = [i for i, r in enumerate(rows) if r is not None]
    ints = np.zeros((b, _VERIFY + k + 1), dtype=np.int64)  # [B, 8 + K]
    ints[:, _POS] = scratch
    ints[:, _VERIFY:] = scratch
    ints[:, _CAP] = max_new_tokens
    u = np.zeros((b, 3, k + 1))  # [B, 3, K+1]
    for i in live:
        r = rows[i]
        n, lack = len(r.seq), len(r.d_lack)
        ints[i, 2 - lack : 2] = r.d_lack
        ints[i, 4 - lack : 4] = np.arange(n - lack, n)
        ints[i, _LAST], ints[i, _LIVE] = r.seq[-1], 1
        ints[i, _CAP] = max(max_new_tokens - r.n_out, 1)
        ints[i, _VERIFY:] = np.arange(n - 1, n + k)
        u[i] = r.u_all[:, r.n_out : r.n_out + k + 1]
    furthest = max(len(rows[i].seq) for i in live) + k
    host = torch.from_numpy(ints)
    on_dev = host.to(device)  # one host → device copy (none on a CPU)
    on_pos = on_dev if pos_device == device else host.to(pos_device)
    return RoundPlan(
        live=live,
        furthest=furthest,
        ids=on_dev[:, _IDS],
        pos=on_pos[:, _POS],
        last=on_dev[:, _LAST],
        cap=on_dev[:, _CAP],
        is_live=on_dev[:, _LIVE].bool(),
        verify_pos=on_pos[:, _VERIFY:],
        u=torch.from_numpy(u).to(device),
    )


# ----------------------------------------------------------------------------- the steps


def guard_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with non-finite entries zeroed, and which rows had one: ``([..., V], [...])``.

    NaN or ±inf logits make p or q non-finite, and sampling from them picks no token
    (``sample_icdf`` returns −1, an out-of-range index that crashes a CPU run and kills a
    CUDA context). The zeroed copy keeps the round's kernels in range until its one host
    copy reads the flag and the round is refused (:func:`nonfinite_error`); finite logits
    pass through unchanged, bit for bit.

    A row's sum is finite iff every entry is (NaN and ±inf propagate; logits are far from
    float32's overflow), so the flag costs one reduction; the copy, one pass.
    """
    import torch

    bad = ~torch.isfinite(logits.sum(-1))  # [...]
    return logits.nan_to_num(0.0, 0.0, 0.0), bad


def draft_block(
    call: Any, plan: RoundPlan, k: int, v: int, config: RunConfig, kv_len: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``K`` draft tokens for every row, autoregressively, each from ``q_i`` by its uniform.

    The first call feeds what each row's draft cache lacks (1 or 2 tokens, left-padded);
    each later call feeds the previous draft ``x_i`` at position ``L + i``.

    Returns:
        drafts ``[B, K]`` int64, q ``[B, K, V]`` (None when K = 0), and which draft
        steps had non-finite logits ``[B, K]``.
    """
    import torch

    b = plan.ids.shape[0]
    if k == 0:
        none = torch.zeros(b, 0, dtype=torch.int64, device=plan.ids.device)  # [B, 0]
        return none, None, none.bool()
    ids, pos = plan.ids, plan.pos  # [B, 2] each
    drafts, q_rows, bad = [], [], []
    for i in range(k):
        logits = call(ids, pos, keep=1, kv_len=kv_len)[:, -1, :v].float()  # [B, V]
        logits, bad_i = guard_logits(logits)  # [B, V], [B]: read with the round's one copy
        q_i = transform_logits(logits, config.temperature, config.top_k, config.top_p)  # [B, V]
        x_i = logits.argmax(-1) if config.greedy else rng.sample_icdf(q_i, plan.u[:, 0, i])  # [B]
        drafts.append(x_i)
        q_rows.append(q_i)
        bad.append(bad_i)
        ids, pos = x_i[:, None], plan.verify_pos[:, i + 1 : i + 2]  # [B, 1]: x_i at L + i
    return torch.stack(drafts, 1), torch.stack(q_rows, 1), torch.stack(bad, 1)


def block_lengths(drafts: torch.Tensor, eos: torch.Tensor | None, cap: torch.Tensor) -> Any:
    """``[B]`` each row's block length: up to its first draft EOS, at most ``cap``.

    Nothing after a draft EOS or past the length limit can be emitted, so the block ends
    there (THEORY §2: the rule decides the shorter block exactly as the one-row decoder
    that stops drafting there would).
    """
    import torch

    b, k = drafts.shape
    if k == 0:
        return torch.zeros(b, dtype=torch.int64, device=drafts.device)
    if eos is not None and _END_BLOCK_AT_DRAFT_EOS:
        is_eos = torch.isin(drafts, eos)  # [B, K]
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, k)  # [B]
    else:
        first = torch.full((b,), k, device=drafts.device)  # [B]
    return torch.minimum(first, cap).to(torch.int64)  # [B]


def verify_block(
    call: Any, plan: RoundPlan, drafts: torch.Tensor, v: int, kv_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One target pass over ``[last emitted, x_1..x_K]`` at ``L-1 .. L+K-1``.

    Returns:
        The target logits ``[B, K+1, V]`` (float32, non-finite entries zeroed) and which
        of them had non-finite entries ``[B, K+1]``.
    """
    import torch

    ids = torch.cat([plan.last[:, None], drafts], 1)  # [B, K+1]
    z = call(ids, plan.verify_pos, kv_len=kv_len)[..., :v].float()  # [B, K+1, V]
    return guard_logits(z)


def used_flags(
    d_bad: torch.Tensor, t_bad: torch.Tensor, lengths: torch.Tensor, is_live: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-finite flags that count: live rows, their blocks' drafts and ``k_r + 1`` rows.

    Idle rows and the slots past a block's end are padding: what they compute is never
    emitted, so it never refuses a round. Returns ``[B, K]`` and ``[B, K+1]``.
    """
    import torch

    if d_bad.shape[1] == 0:  # target-only: one target row per live row
        return d_bad, t_bad & is_live[:, None]
    slot = torch.arange(t_bad.shape[1], device=t_bad.device)[None]  # [1, K+1]
    d_bad = d_bad & (slot[:, :-1] < lengths[:, None]) & is_live[:, None]  # [B, K]
    t_bad = t_bad & (slot <= lengths[:, None]) & is_live[:, None]  # [B, K+1]
    return d_bad, t_bad


def decide(
    rule: Any,
    config: RunConfig,
    state: torch.Tensor | None,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    z: torch.Tensor,
    u: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[Any, torch.Tensor | None]:
    """The round's decision: the rule on the block, or with ``K = 0`` the target's token.

    Args:
        rule: the rule function, ``fn(block, params, state) -> BlockResult``.
        config: the run's configuration (sampling transform, params).
        state: ``[B]`` the rule's per-row state (the ASD ledger), or None.
        drafts: ``[B, K]`` the drafts.
        q: ``[B, K, V]`` their probabilities (None when K = 0).
        z: ``[B, K+1, V]`` the target logits.
        u: ``[B, 3, K+1]`` the rows' uniforms (draft, accept, sample).
        lengths: ``[B]`` the rows' block lengths.

    Returns:
        A ``BlockResult`` (K = 0: nothing accepted, the token sampled from p at its
        uniform, or the argmax when greedy) and p: ``[B, K+1, V]``; with K = 0 ``[B, V]``,
        None when greedy (the log takes it from z).
    """
    import torch

    temperature, top_k, top_p = config.temperature, config.top_k, config.top_p
    k = drafts.shape[1]
    if k == 0:
        z1 = z[:, 0]  # [B, V]
        p = None if config.greedy else transform_logits(z1, temperature, top_k, top_p)  # [B, V]
        y = z1.argmax(-1) if p is None else rng.sample_icdf(p, u[:, 2, 0])  # [B]
        return BlockResult(accepted=torch.zeros_like(y), token=y, diag={}), p
    p = transform_logits(z, temperature, top_k, top_p)  # [B, K+1, V]
    block = Block(
        drafts=drafts,
        p=p,
        q=q,
        target_logits=z,
        u_accept=u[:, 1, :k],  # float64, as every uniform
        u_sample=u[:, 2, : k + 1],
        greedy=config.greedy,
        k_nominal=k,
        diagnostics=False,  # the rest of the diagnostics: roundlog, batched over rounds
        lengths=lengths,
    )
    return rule(block, config.params, state), p


class RoundHost(NamedTuple):
    """What the host reads of one round, for every row, in its one device → host copy."""

    drafts: np.ndarray  # [B, K] int64
    lengths: np.ndarray  # [B] int64 block lengths k_r
    accepted: np.ndarray  # [B] int64 accepted prefix lengths a
    token: np.ndarray  # [B] int64 the emitted recovery or bonus token y
    spent: np.ndarray | None  # [B] float64 ASD ledgers after the round (None: no state)
    bad: bool  # a live row's block had non-finite logits


def read_round(
    drafts: torch.Tensor, lengths: torch.Tensor, res: Any, d_bad: Any, t_bad: Any
) -> RoundHost:
    """The round's one device → host copy (float64 holds every token id exactly).

    Target-only (K = 0) ships only the tokens and the flag: its lengths and accepted
    counts are zeros, known on the host.
    """
    import torch

    b, k = drafts.shape
    parts = [drafts.flatten(), lengths, res.accepted] if k else []
    parts.append(res.token)
    if res.state is not None:
        parts.append(res.state)
    bad = (d_bad.any() | t_bad.any()) if k else t_bad.any()
    host = torch.cat([t.double() for t in parts] + [bad.double().view(1)]).cpu().numpy()
    n_int = b * k + 3 * b if k else b
    ints = host[:n_int].astype(np.int64)
    if k:
        lengths_h, accepted_h, token_h = ints[b * k :].reshape(3, b)
    else:
        lengths_h, accepted_h, token_h = np.zeros(b, np.int64), np.zeros(b, np.int64), ints
    spent = host[n_int:-1] if res.state is not None else None
    return RoundHost(ints[: b * k].reshape(b, k), lengths_h, accepted_h, token_h, spent,
                     bool(host[-1]))  # fmt: skip


# ----------------------------------------------------------------------------- emission


def cut_emitted(
    emitted: list[int],
    m: int,
    stop: str,
    eos_ids: frozenset[int],
    stops: StopStrings | None,
    output: list[int],
) -> tuple[int, str]:
    """How many of a round's ``m`` emittable tokens are kept, and the request's stop.

    The first EOS ends the request (kept, ``"eos"``); else the first token whose text
    completes a task stop string (kept, ``"stop"``); else all ``m`` and ``stop`` unchanged.
    ``output`` is what the request emitted before this round.
    """
    for j, tok in enumerate(emitted[:m]):
        if tok in eos_ids:
            m, stop = j + 1, "eos"
            break
    if stops is not None:
        c = stops.cut([*output, *emitted[:m]], m)
        if c is not None and (c < m or stop != "eos"):
            m, stop = c, "stop"
    return m, stop


def nonfinite_error(
    request_id: str, start: int, n_prompt: int, draft_bad: Any, target_bad: Any
) -> DecodeError:
    """The error for a round whose draft or target logits were not finite.

    Args:
        request_id: the request.
        start: the output position of the round's first token.
        n_prompt: the prompt's length (the sequence position is ``n_prompt + output pos``).
        draft_bad: ``[k]`` flags of the draft steps (empty for target-only decoding).
        target_bad: ``[k + 1]`` flags of the target's rows.
    """
    parts = []
    for role, bad in (("draft", draft_bad), ("target", target_bad)):
        at = np.flatnonzero(np.asarray(bad, dtype=bool))
        if len(at):
            pos = start + int(at[0])
            parts.append(f"{role} model at output position {pos} (sequence position "
                         f"{n_prompt + pos})")  # fmt: skip
    return DecodeError(
        f"request {request_id}: non-finite logits (NaN or inf) from the "
        + " and from the ".join(parts)
        + "; nothing of this request was written (check the weights and the dtype)"
    )


def raise_nonfinite(rows: list[Row | None], d_bad: np.ndarray, t_bad: np.ndarray) -> None:
    """Raise :func:`nonfinite_error` for the first row whose block had non-finite logits.

    Args:
        rows: the batch's rows.
        d_bad: ``[B, K]`` flags of the draft steps.
        t_bad: ``[B, K+1]`` flags of the target's rows.
    """
    for i, r in enumerate(rows):
        if r is not None and (t_bad[i].any() or d_bad[i].any()):
            raise nonfinite_error(r.request_id, r.n_out, len(r.prompt), d_bad[i], t_bad[i])
