"""Verification rules of speculative decoding as batched tensor functions of one block.

Every rule of THEORY §2 — ``exact`` (Leviathan et al. 2023; Chen et al. 2023), ``greedy``,
``nucleus`` (NSD, arXiv 2610.07822), ``asd`` (ASD, arXiv 2608.03447), ``typical`` (Medusa),
``fuzzy`` (Holsman et al. 2025), ``margin`` (MARS) and ``topk`` — is a pure function
``fn(block, params, state) -> BlockResult`` over ``[B, K, V]`` tensors. Rules never loop
over positions or the vocabulary in Python and never synchronise with the host, so the
decoder can call them on the GPU inside the verification step; per-position diagnostics
(docs/ARCHITECTURE.md, ``BlockResult.diag``) are O(V) masked reductions.

Tie order everywhere: probability descending, then token id ascending; argmax ties go to
the first maximum, as ``torch.argmax`` does. The registry
(:mod:`relaxspec_audit.verify.registry`) names these functions; torch is imported inside
them, so importing this module stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaxspec_audit.verify.block import DIAG_KEYS, Block, BlockResult, Cause
from relaxspec_audit.verify.diagnostics import _gather_stats, _LazyStats, token_stats
from relaxspec_audit.verify.params import (
    DEFAULT_THETA,
    AsdParams,
    ExactParams,
    FuzzyParams,
    GreedyParams,
    MarginParams,
    NucleusParams,
    TopkParams,
    TypicalParams,
)

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "rule_asd",
    "rule_exact",
    "rule_fuzzy",
    "rule_greedy",
    "rule_margin",
    "rule_nucleus",
    "rule_topk",
    "rule_typical",
]

# A residual (p − q)_+ with less total mass than this is float noise around p = q: the
# rejection it follows has probability R ≤ this, so falling back to p moves the output
# distribution by at most this much in TV.
_RESIDUAL_EPS = 1e-6


def _fuzzy_divergence(p: Tensor, q: Tensor, kind: str) -> Tensor:
    """D(p‖q) over the last axis, in nats: KL, Jensen–Shannon or TV."""
    import torch

    if kind == "tv":
        return (q - p).clamp_min(0).sum(-1)
    if kind == "kl":
        # xlogy(p, q) = −inf where p > 0 = q, so KL = +inf there, as it should.
        return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(-1)
    m = 0.5 * (p + q)
    kl_pm = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(-1)
    kl_qm = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(-1)
    return 0.5 * (kl_pm + kl_qm)


# ---------------------------------------------------------------------------- rule engine


def _draft_stats(block: Block, theta: float) -> dict[str, Tensor]:
    """token_stats of the drafts plus the ratio test (``passed_ratio``) and ``match``."""
    import torch

    k = block.k
    args = (block.p[:, :k], block.q, block.target_logits[:, :k], block.drafts)
    if block.diagnostics:
        st = token_stats(*args, theta)
    else:
        st = _LazyStats(args[0], args[1], args[3], theta)
        st.update(_gather_stats(*args))
    match = block.drafts == st["target_argmax"]  # [B, K]
    if block.greedy:
        # One-hot limit of the ratio test (ARCHITECTURE, greedy mode).
        passed = match
    else:
        px, qx = st["p"], st["q"]
        # q(x) = 0 cannot happen for a draft sampled from q; guard anyway: p > 0 passes.
        ratio = torch.where(
            qx > 0,
            px / qx.clamp_min(torch.finfo(qx.dtype).tiny),
            torch.where(px > 0, torch.inf, 0.0),
        )
        passed = block.u_accept < ratio.clamp(max=1.0)
    st["passed_ratio"] = passed
    st["match"] = match
    return st


def _emit(block: Block, a: Tensor, recovery: str, greedy_like: bool) -> Tensor:
    """Token emitted after an accepted prefix of length ``a``: recovery at a, or the bonus.

    Args:
        block: The block.
        a: ``[B]`` accepted lengths.
        recovery: ``"residual"`` ((p − q)_+ normalised, THEORY §2.1), ``"p"`` (sample p itself,
            fuzzy) or ``"argmax"`` (target argmax, typical). The bonus samples ``p_{K+1}``.
        greedy_like: Greedy rule or greedy mode: recovery and bonus are the target argmax.

    Returns:
        ``[B]`` int64 tokens.
    """
    import torch

    from relaxspec_audit.verify.rng import sample_icdf

    k = block.k
    rows = torch.arange(a.shape[0], device=a.device)  # [B]
    argmax_tok = block.target_logits[rows, a].argmax(-1)  # [B]
    if greedy_like:
        return argmax_tok
    p_row = block.p[rows, a]  # [B, V]; row K is the bonus distribution
    u = block.u_sample[rows, a]  # [B]
    end = k if block.lengths is None else block.lengths  # [B] or K: each row's block length
    is_bonus = (a == end).unsqueeze(-1)  # [B, 1]
    if recovery == "residual":
        q_row = block.q[rows, a.clamp(max=k - 1)]  # [B, V]
        res = (p_row - q_row).clamp_min(0)
        # Bonus, or a residual that is only float noise (p = q): sample p itself.
        use_p = is_bonus | (res.sum(-1, keepdim=True) <= _RESIDUAL_EPS)
        return sample_icdf(torch.where(use_p, p_row, res), u)
    sampled = sample_icdf(p_row, u)
    if recovery == "p":
        return sampled
    return torch.where(is_bonus.squeeze(-1), sampled, argmax_tok)


def _finish(
    block: Block,
    st: dict[str, Tensor],
    ok: Tensor,
    cause_accept: Tensor,
    cause_reject: Tensor,
    *,
    recovery: str,
    greedy_like: bool,
    state: Tensor | None = None,
) -> BlockResult:
    """Cut the contiguous accepted prefix, label causes, emit the next token."""
    import torch

    k = block.k
    pos = torch.arange(k, device=ok.device)  # [K]
    if block.lengths is not None:  # a row's block ends at its own length (ragged blocks)
        ok = ok & (pos.unsqueeze(0) < block.lengths.unsqueeze(1))  # [B, K]
    acc = torch.cumprod(ok.to(torch.int64), dim=1).bool()  # [B, K], the prefix of all-true
    a = acc.sum(1)  # [B]
    first_reject = pos.unsqueeze(0) == a.unsqueeze(1)  # [B, K]
    if block.lengths is not None:  # past a row's end nothing was rejected: not reached
        first_reject = first_reject & (a < block.lengths).unsqueeze(1)
    not_reached = torch.full_like(cause_accept, int(Cause.NOT_REACHED))
    cause = torch.where(acc, cause_accept, torch.where(first_reject, cause_reject, not_reached))
    if block.diagnostics:
        diag = {key: st[key] for key in DIAG_KEYS[:-2]}
    else:  # only what the decision computed (`in` does not trigger _LazyStats)
        diag = {key: st[key] for key in DIAG_KEYS[:-2] if key in st}
    diag["accepted"] = acc
    diag["cause"] = cause.to(torch.int64)
    token = _emit(block, a, recovery, greedy_like)
    return BlockResult(accepted=a, token=token, diag=diag, state=state)


def _const(like: Tensor, cause: Cause) -> Tensor:
    import torch

    return torch.full(like.shape, int(cause), dtype=torch.int64, device=like.device)


def _where_cause(cond: Tensor, yes: Cause, no: Cause) -> Tensor:
    return _const(cond, yes).where(cond, _const(cond, no))


def _ratio_or(
    block: Block,
    st: dict[str, Tensor],
    extra: Tensor | None,
    extra_cause: Cause,
) -> BlockResult:
    """Rules of the form "ratio test (match in greedy mode) or x ∈ S"; rejection as exact."""
    base = st["passed_ratio"]
    base_cause = Cause.ACCEPT_MATCH if block.greedy else Cause.ACCEPT_RATIO
    reject_cause = Cause.REJECT_MISMATCH if block.greedy else Cause.REJECT_RATIO
    ok = base if extra is None else base | extra
    cause_accept = _where_cause(base, base_cause, extra_cause)
    return _finish(
        block,
        st,
        ok,
        cause_accept,
        _const(ok, reject_cause),
        recovery="residual",
        greedy_like=block.greedy,
    )


def rule_exact(block: Block, params: ExactParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.1: accept iff u < min(1, p/q); recovery from the residual, bonus from p."""
    return _ratio_or(block, _draft_stats(block, DEFAULT_THETA), None, Cause.ACCEPT_RATIO)


def rule_greedy(block: Block, params: GreedyParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.2: accept iff x == argmax z; recovery and bonus are the argmax."""
    st = _draft_stats(block, DEFAULT_THETA)
    st["passed_ratio"] = st["match"]
    return _finish(
        block,
        st,
        st["match"],
        _const(st["match"], Cause.ACCEPT_MATCH),
        _const(st["match"], Cause.REJECT_MISMATCH),
        recovery="argmax",
        greedy_like=True,
        state=state,
    )


def rule_nucleus(block: Block, params: NucleusParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.3: accept iff the ratio test passes or x ∈ N_θ(p); rejection as exact."""
    st = _draft_stats(block, params.theta)
    return _ratio_or(block, st, st["in_nucleus"], Cause.ACCEPT_NUCLEUS)


def rule_topk(block: Block, params: TopkParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.5 topk: ratio test or (x ∈ topK(p) and p(x) ≥ ratio·max p)."""
    st = _draft_stats(block, DEFAULT_THETA)
    extra = (st["rank"] <= params.top_k) & (st["p"] >= params.ratio * st["p_max"])
    return _ratio_or(block, st, extra, Cause.ACCEPT_TOPK)


def rule_margin(block: Block, params: MarginParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.5 margin: if z₂/z₁ > ρ accept x in the target top 2, else the exact test."""
    import torch

    st = _draft_stats(block, DEFAULT_THETA)
    z = block.target_logits[:, : block.k]  # [B, K, V]
    if z.shape[-1] < 2:
        undecided = torch.zeros_like(st["passed_ratio"])
    else:
        top2 = z.topk(2, dim=-1).values  # [B, K, 2]
        # Raw-logit ratio, sign-sensitive as specified; z₁ = 0 gives nan/−inf → decided.
        undecided = (top2[..., 1] / top2[..., 0]) > params.logit_ratio
    return _ratio_or(block, st, undecided & (st["rank"] <= 2), Cause.ACCEPT_MARGIN)


def rule_typical(block: Block, params: TypicalParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.5 typical: accept iff p(x) > min(ε, δ·exp(−H(p))); recovery is the argmax."""
    import torch

    st = _draft_stats(block, DEFAULT_THETA)
    threshold = torch.clamp(params.delta * torch.exp(-st["entropy_p"]), max=params.epsilon)
    ok = st["p"] > threshold
    return _finish(
        block,
        st,
        ok,
        _const(ok, Cause.ACCEPT_TYPICAL),
        _const(ok, Cause.REJECT_TYPICAL),
        recovery="argmax",
        greedy_like=block.greedy,
    )


def rule_fuzzy(block: Block, params: FuzzyParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.5 fuzzy: accept the position iff D(p‖q) ≤ T; at the first failure sample p."""
    st = _draft_stats(block, DEFAULT_THETA)
    d = _fuzzy_divergence(block.p[:, : block.k], block.q, params.divergence)  # [B, K]
    ok = d <= params.threshold
    return _finish(
        block,
        st,
        ok,
        _const(ok, Cause.ACCEPT_DIVERGENCE),
        _const(ok, Cause.REJECT_DIVERGENCE),
        recovery="p",
        greedy_like=block.greedy,
    )


def rule_asd(block: Block, params: AsdParams, state: Tensor | None) -> BlockResult:
    """THEORY §2.4 ASD: gated, budgeted, capped mismatches on a contiguous prefix.

    ``state`` is the ledger ``spent`` ``[B]`` (``None`` = zeros); the result's state is
    ``spent + C_a``. Budget 0 is strict token-ID greedy.
    """
    import torch

    k = block.k
    st = _draft_stats(block, DEFAULT_THETA)
    st["passed_ratio"] = st["match"]
    b = block.drafts.shape[0]
    spent = (
        torch.zeros(b, dtype=torch.float64, device=block.drafts.device)
        if state is None
        else state.to(torch.float64)
    )
    if params.budget == 0:
        # Strict greedy, not "accept when r = 0": a tied non-argmax token is still a mismatch.
        res = rule_greedy(block, GreedyParams(), None)
        res.state = spent
        return res
    d = ~st["match"]  # [B, K] mismatch d_i
    r = st["regret"].to(torch.float64)  # [B, K] r_i = z(y*) − z(x) ≥ 0
    k_run = block.k_nominal or k  # the run's K (a block cut at a draft EOS is shorter)
    remaining = torch.arange(k_run, k_run - k, -1, device=d.device, dtype=torch.float64)  # K−i+1
    cost = torch.where(d, r, 0.0)  # d_i r_i
    c = torch.cumsum(cost, 1)  # [B, K] C_i
    n = torch.cumsum(d.to(torch.float64), 1)  # [B, K] N_i
    gate_ok = r / remaining <= params.gate
    budget_ok = c <= (params.budget - spent).unsqueeze(1)
    cap_ok = n <= params.cap
    ok = ~d | (gate_ok & budget_ok & cap_ok)
    cause_accept = _where_cause(d, Cause.ACCEPT_EXCEPTION, Cause.ACCEPT_MATCH)
    cause_reject = torch.where(
        ~gate_ok,
        int(Cause.REJECT_GATE),
        torch.where(~budget_ok, int(Cause.REJECT_BUDGET), int(Cause.REJECT_CAP)),
    ).to(torch.int64)
    res = _finish(block, st, ok, cause_accept, cause_reject, recovery="argmax", greedy_like=True)
    # Ledger: s ← s + C_a, the regret of the accepted exceptions only.
    res.state = spent + torch.where(res.diag["accepted"], cost, 0.0).sum(1)
    return res
