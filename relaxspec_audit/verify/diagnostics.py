"""Per-position diagnostics of any token under p and q, and NSD's E_S on a θ grid.

:func:`token_stats` gives p(x), q(x), rank, mass above, nucleus membership, entropies,
TV(p, q) and logit regret (THEORY §2, §3) with O(V) masked reductions, no sort and no host
sync; :func:`es_grid` gives the extra acceptance ``E_S(θ)`` at every θ (THEORY §2.3).
Tie order: probability descending, then token id ascending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from relaxspec_audit.verify.block import TOKEN_STAT_KEYS
from relaxspec_audit.verify.params import DEFAULT_THETA, bad_thetas

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["es_grid", "token_stats"]


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
    else:  # R = Σ (q − p)_+ (THEORY §2.1)
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
    """``x ∈ N_θ(p) ⇔ mass_above(x) < θ`` (THEORY §2.3), excluding zero-probability tokens.

    In exact arithmetic a zero-probability token has mass_above = 1 ≥ θ; in floats the sum
    can fall just below 1, and at θ = 1 the nucleus is exactly the support of p.
    """
    if theta >= 1.0:
        return px > 0
    return (mass_above < theta) & (px > 0)


def es_grid(p: Tensor, q: Tensor, thetas: Any) -> Tensor:
    """Extra acceptance ``E_S(θ) = Σ_{x ∈ N_θ(p)} (q(x) − p(x))_+`` at every θ (THEORY §2.3).

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
    if bad_thetas(grid_np.tolist()):
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
