"""Verification rules of speculative decoding as batched tensor functions of one block.

Every rule of SPEC §2 — ``exact`` (Leviathan et al. 2023; Chen et al. 2023), ``greedy``,
``nucleus`` (NSD, arXiv 2610.07822), ``asd`` (ASD, arXiv 2608.03447), ``typical`` (Medusa),
``fuzzy`` (Holsman et al. 2025), ``margin`` (MARS) and ``topk`` — is a pure function
``fn(block, params, state) -> BlockResult`` over ``[B, K, V]`` tensors. Rules never loop
over positions or the vocabulary in Python and never synchronise with the host, so the
decoder can call them on the GPU inside the verification step; per-position diagnostics
(docs/ARCHITECTURE.md, ``BlockResult.diag``) are O(V) masked reductions.

Tie order everywhere: probability descending, then token id ascending; argmax ties go to
the first maximum, as ``torch.argmax`` does.

torch is imported inside functions, so ``Cause`` and the params classes are importable on
the lightweight path (stats, CLI ``--help``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "DEFAULT_THETA",
    "DIAG_KEYS",
    "RULES",
    "TOKEN_STAT_KEYS",
    "AsdParams",
    "Block",
    "BlockResult",
    "Cause",
    "ExactParams",
    "FuzzyParams",
    "GreedyParams",
    "MarginParams",
    "NucleusParams",
    "RuleSpec",
    "TopkParams",
    "TypicalParams",
    "asd_accept_length",
    "es_grid",
    "make_params",
    "simulate_position",
    "token_stats",
]

DEFAULT_THETA = 0.95  # nucleus θ for `in_nucleus` of rules without their own (SPEC §2.3)

#: Keys of :func:`token_stats` (any token: drafts, recovery and bonus rows).
TOKEN_STAT_KEYS = (
    "p",
    "q",
    "p_max",
    "rank",
    "mass_above",
    "entropy_p",
    "entropy_q",
    "tv_pq",
    "regret",
    "target_argmax",
    "in_nucleus",
)
#: Keys of ``BlockResult.diag`` (draft positions), in the order the decoder ships them.
DIAG_KEYS = (*TOKEN_STAT_KEYS[:-1], "passed_ratio", "in_nucleus", "accepted", "cause")

# A residual (p − q)_+ with less total mass than this is float noise around p = q: the
# rejection it follows has probability R ≤ this, so falling back to p moves the output
# distribution by at most this much in TV.
_RESIDUAL_EPS = 1e-6


class Cause(enum.IntEnum):
    """Why a position was accepted or rejected; ``name.lower()`` is the string in the logs.

    The one closed enumeration of causes (DESIGN.md "Logs").
    """

    ACCEPT_RATIO = 0  # u < min(1, p/q)
    ACCEPT_MATCH = 1  # x == target argmax (greedy-type rules, every rule in greedy mode)
    ACCEPT_NUCLEUS = 2  # NSD: failed the ratio test but x in N_theta(p)
    ACCEPT_EXCEPTION = 3  # ASD: mismatch accepted within gate/budget/cap
    ACCEPT_TYPICAL = 4  # typical: p(x) > min(eps, delta*exp(-H(p)))
    ACCEPT_DIVERGENCE = 5  # fuzzy: D(p||q) <= T
    ACCEPT_MARGIN = 6  # margin: target undecided and x in target top-2
    ACCEPT_TOPK = 7  # topk: x in topK(p) and p(x) >= ratio * max p
    REJECT_RATIO = 8  # failed u < min(1, p/q) and every relaxation of the rule
    REJECT_MISMATCH = 9  # x != target argmax (greedy-type rules, greedy mode)
    REJECT_GATE = 10  # ASD: mismatch with r_i / (K - i + 1) > gate
    REJECT_BUDGET = 11  # ASD: cumulative regret C_i > budget - spent
    REJECT_CAP = 12  # ASD: more than `cap` mismatches in the block
    REJECT_TYPICAL = 13  # typical: p(x) <= threshold
    REJECT_DIVERGENCE = 14  # fuzzy: D(p||q) > T
    NOT_REACHED = 15  # draft position after the first rejection (still scored and logged)
    RECOVERY = 16  # emitted token at the first rejected position
    BONUS = 17  # emitted token after a fully accepted block


# ---------------------------------------------------------------------------- data classes


@dataclasses.dataclass
class Block:
    """Inputs of one verification block (all tensors on one device).

    Attributes:
        drafts: ``[B, K]`` int64 draft tokens x_1..x_K.
        p: ``[B, K+1, V]`` float target probabilities after the sampling transform.
        q: ``[B, K, V]`` float draft probabilities the drafts were sampled from.
        target_logits: ``[B, K+1, V]`` raw target logits (regret, margin, argmax).
        u_accept: ``[B, K]`` acceptance uniforms.
        u_sample: ``[B, K+1]`` recovery uniform at each position; column K is the bonus.
        greedy: Temperature 0: ratio tests become token equality with the target argmax,
            and recovery/bonus are the target argmax.
        k_nominal: The run's K when this block is shorter (the decoder stops drafting at a
            draft EOS or at the length limit, after which no draft can be emitted). ASD's
            remaining length stays ``K_nominal − i + 1``, so decisions equal those on the
            full block. None: ``K``.
        diagnostics: Return every key of ``DIAG_KEYS`` in ``BlockResult.diag``. False: the
            rule computes only the statistics its decision needs, and ``diag`` holds those
            plus ``passed_ratio``, ``accepted`` and ``cause`` (the decoder computes the rest
            batched over rounds, off the per-round path).
    """

    drafts: Tensor
    p: Tensor
    q: Tensor
    target_logits: Tensor
    u_accept: Tensor
    u_sample: Tensor
    greedy: bool = False
    k_nominal: int | None = None
    diagnostics: bool = True

    def __post_init__(self) -> None:
        # Shape checks only: they read metadata, never device values.
        if self.drafts.dim() != 2:
            raise ValueError(f"Block.drafts: expected [B, K], got {tuple(self.drafts.shape)}")
        b, k = self.drafts.shape
        if k < 1:
            raise ValueError("Block.drafts: K must be >= 1")
        if self.p.dim() != 3 or self.p.shape[:2] != (b, k + 1):
            raise ValueError(
                f"Block.p: expected [B={b}, K+1={k + 1}, V], got {tuple(self.p.shape)}"
            )
        v = self.p.shape[2]
        expected = {
            "q": (self.q, (b, k, v)),
            "target_logits": (self.target_logits, (b, k + 1, v)),
            "u_accept": (self.u_accept, (b, k)),
            "u_sample": (self.u_sample, (b, k + 1)),
        }
        for name, (t, shape) in expected.items():
            if tuple(t.shape) != shape:
                raise ValueError(f"Block.{name}: expected shape {shape}, got {tuple(t.shape)}")
        if self.k_nominal is not None and self.k_nominal < k:
            raise ValueError(f"Block.k_nominal: must be >= K = {k}, got {self.k_nominal}")

    @property
    def k(self) -> int:
        """Number of draft positions K."""
        return self.drafts.shape[1]


@dataclasses.dataclass
class BlockResult:
    """Output of a rule on one block.

    Attributes:
        accepted: ``[B]`` int64 in ``[0, K]``, length of the accepted prefix ``a``.
        token: ``[B]`` int64, the recovery token at position ``a`` (``a < K``) or the bonus.
        diag: Per-position diagnostics, each ``[B, K]``: ``p``, ``q``, ``p_max``, ``rank``,
            ``mass_above``, ``entropy_p``, ``entropy_q``, ``tv_pq``, ``regret``,
            ``target_argmax``, ``passed_ratio``, ``in_nucleus``, ``accepted``, ``cause``
            (int64 :class:`Cause` values).
        state: ``[B]`` new per-request state (ASD ledger ``spent``), else ``None``.
    """

    accepted: Tensor
    token: Tensor
    diag: dict[str, Tensor]
    state: Tensor | None = None


# ---------------------------------------------------------------------------- parameters


def _check(ok: bool, field: str, message: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}, got {value!r}")


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ExactParams:
    """``exact`` has no parameters (SPEC §2.1)."""


@dataclasses.dataclass(frozen=True)
class GreedyParams:
    """``greedy`` has no parameters (SPEC §2.2)."""


@dataclasses.dataclass(frozen=True)
class NucleusParams:
    """NSD parameters (SPEC §2.3).

    Attributes:
        theta: Nucleus mass θ in (0, 1].
    """

    theta: float = DEFAULT_THETA

    def __post_init__(self) -> None:
        _check(
            _is_real(self.theta) and 0.0 < self.theta <= 1.0,
            "theta",
            "must be in (0, 1]",
            self.theta,
        )


@dataclasses.dataclass(frozen=True)
class AsdParams:
    """ASD parameters (SPEC §2.4); ``math.inf`` is allowed for gate, budget and cap.

    Attributes:
        budget: Request regret budget B >= 0; 0 dispatches to strict greedy.
        gate: Local gate g >= 0 on r_i / (K − i + 1).
        cap: Per-block mismatch cap M >= 0 (int, or ``math.inf``).
    """

    budget: float = 8.0
    gate: float = 0.25
    cap: int | float = 2

    def __post_init__(self) -> None:
        _check(_is_real(self.budget) and self.budget >= 0, "budget", "must be >= 0", self.budget)
        _check(_is_real(self.gate) and self.gate >= 0, "gate", "must be >= 0", self.gate)
        _check(
            _is_real(self.cap)
            and self.cap >= 0
            and (self.cap == math.inf or self.cap == int(self.cap)),
            "cap",
            "must be an int >= 0 or math.inf",
            self.cap,
        )


@dataclasses.dataclass(frozen=True)
class TypicalParams:
    """Typical acceptance parameters (SPEC §2.5).

    Attributes:
        epsilon: Hard threshold ε >= 0.
        delta: Entropy-scaled threshold factor δ >= 0.
    """

    epsilon: float = 0.09
    delta: float = 0.3

    def __post_init__(self) -> None:
        _check(
            _is_real(self.epsilon) and self.epsilon >= 0, "epsilon", "must be >= 0", self.epsilon
        )
        _check(_is_real(self.delta) and self.delta >= 0, "delta", "must be >= 0", self.delta)


_DIVERGENCES = ("kl", "js", "tv")


@dataclasses.dataclass(frozen=True)
class FuzzyParams:
    """Fuzzy speculative decoding parameters (SPEC §2.5).

    Attributes:
        divergence: ``"kl"`` (KL(p‖q)), ``"js"`` (Jensen–Shannon, nats) or ``"tv"``.
        threshold: Accept the position iff D(p‖q) <= threshold (>= 0).
    """

    divergence: str = "kl"
    threshold: float = 0.1

    def __post_init__(self) -> None:
        _check(
            self.divergence in _DIVERGENCES,
            "divergence",
            f"must be one of {_DIVERGENCES}",
            self.divergence,
        )
        _check(
            _is_real(self.threshold) and self.threshold >= 0,
            "threshold",
            "must be >= 0",
            self.threshold,
        )


@dataclasses.dataclass(frozen=True)
class MarginParams:
    """Margin-aware verification parameters (SPEC §2.5).

    Attributes:
        theta: Undecided iff z₂/z₁ > theta (raw target logits; finite real).
    """

    theta: float = 0.9

    def __post_init__(self) -> None:
        _check(
            _is_real(self.theta) and math.isfinite(self.theta),
            "theta",
            "must be finite",
            self.theta,
        )


@dataclasses.dataclass(frozen=True)
class TopkParams:
    """Top-k relaxed acceptance parameters (SPEC §2.5).

    Attributes:
        top_k: Draft must be within the target's top ``top_k`` (int >= 1).
        ratio: And have p(x) >= ratio · max p (ratio in [0, 1]).
    """

    top_k: int = 10
    ratio: float = 0.1

    def __post_init__(self) -> None:
        _check(
            isinstance(self.top_k, int | np.integer)
            and not isinstance(self.top_k, bool)
            and self.top_k >= 1,
            "top_k",
            "must be an int >= 1",
            self.top_k,
        )
        _check(
            _is_real(self.ratio) and 0.0 <= self.ratio <= 1.0,
            "ratio",
            "must be in [0, 1]",
            self.ratio,
        )


# ---------------------------------------------------------------------------- diagnostics


def token_stats(
    p: Tensor,
    q: Tensor | None,
    logits: Tensor,
    tokens: Tensor,
    theta: float = DEFAULT_THETA,
) -> dict[str, Tensor]:
    """Per-token diagnostics of ``tokens`` under ``p`` (and ``q``), for any leading shape.

    Used for draft positions inside every rule and by the decoder for recovery/bonus rows.
    ``mass_above`` and ``rank`` are O(V) masked reductions with the tie order
    (probability desc, id asc) — no sort.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities, or ``None`` (bonus rows): then ``q``,
            ``entropy_q`` and ``tv_pq`` are NaN.
        logits: ``[..., V]`` raw target logits.
        tokens: ``[...]`` int64 token ids.
        theta: Nucleus mass θ for ``in_nucleus``.

    Returns:
        Dict of ``[...]`` tensors: ``p``, ``q``, ``p_max``, ``rank`` (1-based, int64),
        ``mass_above``, ``entropy_p``, ``entropy_q``, ``tv_pq``, ``regret``,
        ``target_argmax`` (int64), ``in_nucleus`` (bool).
    """
    out = _gather_stats(p, q, logits, tokens)
    out.update(_order_stats(p, out["p"], tokens, theta))
    out.update(_spread_stats(p, q))
    return out


# The parts of token_stats, each computed with as few [..., V] temporaries as possible (on
# CPU every full-size temporary costs a pass over fresh memory).


def _gather_stats(p: Tensor, q: Tensor | None, logits: Tensor, tokens: Tensor) -> dict[str, Tensor]:
    """``p``, ``q``, ``regret``, ``target_argmax``: gathers and one max over V."""
    import torch

    t = tokens.unsqueeze(-1)  # [..., 1]
    px = p.gather(-1, t).squeeze(-1)
    z_max, z_arg = logits.max(-1)  # one pass; the index is the first maximum on ties
    return {
        "p": px,
        "q": torch.full_like(px, float("nan")) if q is None else q.gather(-1, t).squeeze(-1),
        "regret": z_max - logits.gather(-1, t).squeeze(-1),
        "target_argmax": z_arg.to(torch.int64),
    }


def _order_stats(p: Tensor, px: Tensor, tokens: Tensor, theta: float) -> dict[str, Tensor]:
    """``rank``, ``mass_above``, ``in_nucleus`` of the tokens (tie order: p desc, id asc)."""
    import torch

    ids = torch.arange(p.shape[-1], device=p.device)  # [V]
    pxe = px.unsqueeze(-1)  # [..., 1]
    # Tokens ranked before x: strictly more probable, or equally probable with a smaller id.
    before = (p > pxe).logical_or_((p == pxe).logical_and_(ids < tokens.unsqueeze(-1)))
    # float64 accumulation so the nucleus boundary test is not decided by float32 drift
    # over V terms (p · mask is exact; the sum upcasts without a float64 copy of p).
    mass_above = (p * before).sum(-1, dtype=torch.float64)  # [...]
    return {
        "rank": before.sum(-1).add_(1).to(torch.int64),
        "mass_above": mass_above.to(p.dtype),
        "in_nucleus": _nucleus_test(mass_above, px, theta),
    }


def _spread_stats(p: Tensor, q: Tensor | None) -> dict[str, Tensor]:
    """``p_max``, ``entropy_p``, ``entropy_q``, ``tv_pq`` (NaN without q)."""
    import torch

    out = {"p_max": p.amax(-1), "entropy_p": _entropy(p)}
    if q is None:
        nan = torch.full_like(out["p_max"], float("nan"))
        out.update(entropy_q=nan, tv_pq=nan.clone())
    else:  # R = Σ (q − p)_+ (SPEC §2.1)
        out.update(entropy_q=_entropy(q), tv_pq=(q - p).clamp_min_(0).sum(-1))
    return out


_ORDER_KEYS = ("rank", "mass_above", "in_nucleus")


def _entropy(p: Tensor) -> Tensor:
    """``H(p) = −Σ p log p`` over the last axis, with ``0 log 0 = 0``.

    ``p · log p`` then NaN → 0 (only ``0 · −inf`` is NaN): the same products as
    ``xlogy(p, p)``, at less than half its cost on CPU.
    """
    return -(p * p.log()).nan_to_num_(0.0).sum(-1)


class _LazyStats(dict):
    """Draft statistics that compute the other parts of :func:`token_stats` on first use.

    Holds the keys of :func:`_gather_stats` (plus what the rule adds); reading a key of
    :func:`_order_stats` or :func:`_spread_stats` computes that part once.
    """

    def __init__(self, p: Tensor, q: Tensor, tokens: Tensor, theta: float):
        self._args = (p, q, tokens, theta)
        super().__init__()

    def __missing__(self, key: str) -> Tensor:
        p, q, tokens, theta = self._args
        if key in _ORDER_KEYS:
            self.update(_order_stats(p, self["p"], tokens, theta))
        elif key in TOKEN_STAT_KEYS:
            self.update(_spread_stats(p, q))
        else:
            raise KeyError(key)
        return self[key]


def _nucleus_test(mass_above: Tensor, px: Tensor, theta: float) -> Tensor:
    """``x ∈ N_θ(p) ⇔ mass_above(x) < θ`` (SPEC §2.3), excluding zero-probability tokens.

    In exact arithmetic a zero-probability token has mass_above = 1 ≥ θ; in floats the sum
    can fall just below 1, and at θ = 1 the nucleus is exactly the support of p.
    """
    if theta >= 1.0:
        return px > 0
    return (mass_above < theta) & (px > 0)


def es_grid(p: Tensor, q: Tensor, thetas: Any) -> Tensor:
    """Extra acceptance ``E_S(θ) = Σ_{x ∈ N_θ(p)} (q(x) − p(x))_+`` at every θ (SPEC §2.3).

    One stable sort of p per position (ties keep id order), then cumulative sums and a
    searchsorted over the grid.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities.
        thetas: ``[G]`` nucleus masses in (0, 1] (sequence or tensor).

    Returns:
        ``[..., G]`` float32 E_S values.
    """
    import torch

    # Validate on the host before the grid goes to the device (no sync on p's device).
    grid_np = np.asarray(thetas.cpu() if hasattr(thetas, "cpu") else thetas, dtype=np.float64)
    grid_np = grid_np.reshape(-1)
    if not ((grid_np > 0) & (grid_np <= 1)).all():
        raise ValueError(f"thetas: must all be in (0, 1], got {grid_np.tolist()}")
    thetas = torch.as_tensor(grid_np, device=p.device)  # [G]
    p_sorted, order = torch.sort(p, dim=-1, descending=True, stable=True)  # [..., V]
    surplus = (q - p).clamp_min(0).gather(-1, order).to(torch.float64)  # [..., V]
    p64 = p_sorted.to(torch.float64)
    # Exclusive cumsum (not cumsum − p, which misplaces exact boundaries), non-decreasing.
    mass_above = torch.cat([torch.zeros_like(p64[..., :1]), torch.cumsum(p64, -1)[..., :-1]], -1)
    lead = p.shape[:-1]
    grid = thetas.expand(*lead, thetas.numel()).contiguous()  # [..., G]
    # Number of leading tokens with mass_above < θ, capped to the support of p.
    n_in = torch.searchsorted(mass_above.contiguous(), grid, right=False)  # [..., G]
    n_pos = (p > 0).sum(-1, keepdim=True)  # [..., 1]
    n_in = torch.minimum(n_in, n_pos)
    n_in = torch.where(grid >= 1.0, n_pos.expand_as(n_in), n_in)
    csum = torch.cumsum(surplus, -1)  # [..., V]
    csum = torch.cat([torch.zeros_like(csum[..., :1]), csum], -1)  # [..., V+1]
    return csum.gather(-1, n_in).to(torch.float32)


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
        recovery: ``"residual"`` ((p − q)_+ normalised, SPEC §2.1), ``"p"`` (sample p itself,
            fuzzy) or ``"argmax"`` (target argmax, typical). The bonus samples ``p_{K+1}``.
        greedy_like: Greedy rule or greedy mode: recovery and bonus are the target argmax.

    Returns:
        ``[B]`` int64 tokens.
    """
    import torch

    from relaxspec_audit.rng import sample_icdf

    k = block.k
    rows = torch.arange(a.shape[0], device=a.device)  # [B]
    argmax_tok = block.target_logits[rows, a].argmax(-1)  # [B]
    if greedy_like:
        return argmax_tok
    p_row = block.p[rows, a]  # [B, V]; row K is the bonus distribution
    u = block.u_sample[rows, a]  # [B]
    is_bonus = (a == k).unsqueeze(-1)  # [B, 1]
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
    acc = torch.cumprod(ok.to(torch.int64), dim=1).bool()  # [B, K], the prefix of all-true
    a = acc.sum(1)  # [B]
    pos = torch.arange(k, device=a.device)  # [K]
    first_reject = pos.unsqueeze(0) == a.unsqueeze(1)  # [B, K]
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


def _rule_exact(block: Block, params: ExactParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.1: accept iff u < min(1, p/q); recovery from the residual, bonus from p."""
    return _ratio_or(block, _draft_stats(block, DEFAULT_THETA), None, Cause.ACCEPT_RATIO)


def _rule_greedy(block: Block, params: GreedyParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.2: accept iff x == argmax z; recovery and bonus are the argmax."""
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


def _rule_nucleus(block: Block, params: NucleusParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.3: accept iff the ratio test passes or x ∈ N_θ(p); rejection as exact."""
    st = _draft_stats(block, params.theta)
    return _ratio_or(block, st, st["in_nucleus"], Cause.ACCEPT_NUCLEUS)


def _rule_topk(block: Block, params: TopkParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.5 topk: ratio test or (x ∈ topK(p) and p(x) ≥ ratio·max p)."""
    st = _draft_stats(block, DEFAULT_THETA)
    extra = (st["rank"] <= params.top_k) & (st["p"] >= params.ratio * st["p_max"])
    return _ratio_or(block, st, extra, Cause.ACCEPT_TOPK)


def _rule_margin(block: Block, params: MarginParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.5 margin: if z₂/z₁ > θ accept x in the target top 2, else the exact test."""
    import torch

    st = _draft_stats(block, DEFAULT_THETA)
    z = block.target_logits[:, : block.k]  # [B, K, V]
    if z.shape[-1] < 2:
        undecided = torch.zeros_like(st["passed_ratio"])
    else:
        top2 = z.topk(2, dim=-1).values  # [B, K, 2]
        # Raw-logit ratio, sign-sensitive as specified; z₁ = 0 gives nan/−inf → decided.
        undecided = (top2[..., 1] / top2[..., 0]) > params.theta
    return _ratio_or(block, st, undecided & (st["rank"] <= 2), Cause.ACCEPT_MARGIN)


def _rule_typical(block: Block, params: TypicalParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.5 typical: accept iff p(x) > min(ε, δ·exp(−H(p))); recovery is the argmax."""
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


def _rule_fuzzy(block: Block, params: FuzzyParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.5 fuzzy: accept the position iff D(p‖q) ≤ T; at the first failure sample p."""
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


def _rule_asd(block: Block, params: AsdParams, state: Tensor | None) -> BlockResult:
    """SPEC §2.4 ASD: gated, budgeted, capped mismatches on a contiguous prefix.

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
        res = _rule_greedy(block, GreedyParams(), None)
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


# ---------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class RuleSpec:
    """A registered rule.

    Attributes:
        name: Rule name as in SPEC §2 and the logs.
        fn: ``fn(block, params, state) -> BlockResult``.
        params_cls: Frozen params dataclass (build with :func:`make_params`).
        greedy_only: The rule always verifies greedily (decode at temperature 0).
    """

    name: str
    fn: Callable[[Block, Any, Any], BlockResult]
    params_cls: type
    greedy_only: bool = False


RULES: dict[str, RuleSpec] = {
    spec.name: spec
    for spec in (
        RuleSpec("exact", _rule_exact, ExactParams),
        RuleSpec("greedy", _rule_greedy, GreedyParams, greedy_only=True),
        RuleSpec("nucleus", _rule_nucleus, NucleusParams),
        RuleSpec("asd", _rule_asd, AsdParams, greedy_only=True),
        RuleSpec("typical", _rule_typical, TypicalParams),
        RuleSpec("fuzzy", _rule_fuzzy, FuzzyParams),
        RuleSpec("margin", _rule_margin, MarginParams),
        RuleSpec("topk", _rule_topk, TopkParams),
    )
}


def make_params(rule: str, **kw: Any) -> Any:
    """Build a rule's frozen params from keyword overrides of its defaults.

    Args:
        rule: Rule name (key of :data:`RULES`).
        **kw: Parameter overrides.

    Returns:
        The rule's params dataclass instance.

    Raises:
        ValueError: Unknown rule, unknown parameter or invalid value (the message names the
            field, e.g. ``"theta: must be in (0, 1], got 1.5"``).
    """
    if rule not in RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; known: {sorted(RULES)}")
    cls = RULES[rule].params_cls
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kw) - known)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: unknown parameter of rule {rule!r}; known: {sorted(known) or 'none'}"
        )
    return cls(**kw)


# ---------------------------------------------------------------------------- helpers


def simulate_position(
    rule: str,
    p: Any,
    q: Any,
    n: int,
    seed: int = 0,
    logits: Any = None,
    **params: Any,
) -> np.ndarray:
    """Emitted tokens at one position, through the same batched block code (K = 1).

    Each of the ``n`` trials draws a draft from ``q`` by inverse CDF, runs the rule on a
    one-position block and emits the draft if accepted, else the recovery token (no bonus).
    Uniforms are keyed (``rng.uniforms``) by ``seed`` and the trial index.

    Args:
        rule: Rule name.
        p: ``[V]`` target distribution.
        q: ``[V]`` draft distribution.
        n: Number of trials.
        seed: Seed of the keyed uniforms.
        logits: ``[V]`` target logits (margin, regret, argmax); default ``log p``.
        **params: Rule parameters (:func:`make_params`).

    Returns:
        ``[n]`` int64 emitted token ids.
    """
    import torch

    from relaxspec_audit.rng import Purpose, sample_icdf, uniforms

    prm = make_params(rule, **params)
    p_t = torch.as_tensor(np.asarray(p, dtype=np.float64), dtype=torch.float32).reshape(-1)
    q_t = torch.as_tensor(np.asarray(q, dtype=np.float64), dtype=torch.float32).reshape(-1)
    if p_t.shape != q_t.shape:
        raise ValueError(f"q: shape {tuple(q_t.shape)} != p shape {tuple(p_t.shape)}")
    z_t = (
        torch.log(p_t)
        if logits is None
        else torch.as_tensor(np.asarray(logits, dtype=np.float64), dtype=torch.float32).reshape(-1)
    )
    v = p_t.shape[0]
    trials = np.arange(n, dtype=np.int64)
    u_draft = torch.as_tensor(uniforms(seed, 0, trials, Purpose.DRAFT))
    u_acc = torch.as_tensor(uniforms(seed, 0, trials, Purpose.ACCEPT))
    u_smp = torch.as_tensor(uniforms(seed, 0, trials, Purpose.SAMPLE))
    out = []
    chunk = max(1, min(n, 2**22 // max(v, 1)))  # bound the [n, 2, V] tensors to ~16 MB each
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        drafts = sample_icdf(q_t.expand(m, v), u_draft[s : s + m]).unsqueeze(1)  # [m, 1]
        block = Block(
            drafts=drafts,
            p=p_t.expand(m, 2, v),
            q=q_t.expand(m, 1, v),
            target_logits=z_t.expand(m, 2, v),
            u_accept=u_acc[s : s + m].unsqueeze(1),
            u_sample=torch.stack([u_smp[s : s + m], u_smp[s : s + m]], 1),
            greedy=False,
        )
        res = RULES[rule].fn(block, prm, None)
        out.append(torch.where(res.accepted == 1, drafts[:, 0], res.token))
    return torch.cat(out).numpy().astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def asd_accept_length(
    draft_tokens: Any,
    target_logits: Any,
    *,
    budget: float,
    gate: float,
    cap: int | float,
    spent: float = 0.0,
) -> tuple[int, float]:
    """ASD accepted length and new ledger for one block, through the batched rule code.

    Args:
        draft_tokens: ``[K]`` draft token ids.
        target_logits: ``[K+1, V]`` (or ``[K, V]``) raw target logits.
        budget: Request budget B.
        gate: Local gate g.
        cap: Per-block mismatch cap M.
        spent: Ledger before the block.

    Returns:
        ``(accepted_length, new_spent)``.
    """
    import torch

    prm = make_params("asd", budget=budget, gate=gate, cap=cap)
    x = torch.as_tensor(np.asarray(draft_tokens), dtype=torch.int64).reshape(1, -1)  # [1, K]
    z = torch.as_tensor(np.asarray(target_logits, dtype=np.float64), dtype=torch.float32)
    k = x.shape[1]
    if z.dim() != 2 or z.shape[0] not in (k, k + 1):
        raise ValueError(
            f"target_logits: expected [K+1={k + 1}, V] or [K={k}, V], got {tuple(z.shape)}"
        )
    if z.shape[0] == k:
        z = torch.cat([z, z[-1:]], 0)  # bonus row is not used by the accepted length
    z = z.unsqueeze(0)  # [1, K+1, V]
    p = torch.softmax(z, -1)
    block = Block(
        drafts=x,
        p=p,
        q=p[:, :k],
        target_logits=z,
        u_accept=torch.zeros(1, k),
        u_sample=torch.zeros(1, k + 1),
        greedy=True,
    )
    res = _rule_asd(block, prm, torch.tensor([float(spent)], dtype=torch.float64))
    return int(res.accepted[0]), float(res.state[0])
