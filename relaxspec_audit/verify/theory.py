"""Exact single-position maths of the verification rules (numpy in, numpy/float out).

The acceptance probability and the output distribution of a rule at one position, with the
draft drawn from ``q`` and the rule's recovery on rejection (THEORY §2), plus the block-level
formulas of THEORY §1 (E[τ], modelled speedup) and the coupling bound of THEORY §2.3.

Rules ``nucleus``, ``topk`` and ``margin`` all accept "the exact ratio test, or x ∈ S" for a
token set S and reject to the residual, so they share one formula (THEORY §2.3 with N_θ
replaced by S)::

    P(y) = min(p, q)(y) + [y ∈ S]·(q − p)_+(y) + (R − E_S)·(p − q)_+(y) / R,
    E_S = Σ_{x ∈ S} (q − p)_+(x),   P(accept) = 1 − R + E_S.

Parameters and defaults come from :func:`relaxspec_audit.verify.registry.make_params`, and the
nucleus uses the same tie order as the rules (probability desc, then token id asc). Nothing
here samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from relaxspec_audit.verify.registry import make_params

__all__ = [
    "acceptance_probability",
    "expected_tokens_per_pass",
    "extra_acceptance",
    "identical_output_bound",
    "modelled_speedup",
    "nucleus_mask",
    "output_distribution",
    "tv",
]

_SUM_TOL = 1e-6  # how far from 1 a distribution's total may be (float32 softmax rounding)


def _dist(x: Any, name: str) -> np.ndarray:
    """Validate a probability vector: 1-D, finite, non-negative, sums to 1."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D distribution, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name}: entries must be finite and >= 0")
    if abs(a.sum() - 1.0) > _SUM_TOL:
        raise ValueError(f"{name}: must sum to 1, sums to {a.sum():.9g}")
    return a


def _pair(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
    p, q = _dist(p, "p"), _dist(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"q: shape {q.shape} != p shape {p.shape}")
    return p, q


def _rank(p: np.ndarray) -> np.ndarray:
    """1-based rank of every token under the tie order (probability desc, id asc)."""
    order = np.argsort(-p, kind="stable")  # stable: equal p keep ascending id order
    rank = np.empty(p.size, dtype=np.int64)
    rank[order] = np.arange(1, p.size + 1)
    return rank


def _mass_above(p: np.ndarray) -> np.ndarray:
    """Total p of the tokens ranked before each token (THEORY §2.3)."""
    order = np.argsort(-p, kind="stable")
    sorted_p = p[order]
    out = np.empty_like(p)
    # Exclusive cumsum, not cumsum − p: the latter misplaces exact boundaries (.7 − .3 < .4).
    out[order] = np.concatenate([[0.0], np.cumsum(sorted_p)[:-1]])
    return out


def nucleus_mask(p: Any, theta: float) -> np.ndarray:
    """Membership in the nucleus ``N_θ(p)``: ``mass_above(x) < θ`` (THEORY §2.3).

    Zero-probability tokens are never in the nucleus; at θ = 1 it is the support of p.

    Args:
        p: ``[V]`` target distribution.
        theta: Nucleus mass in (0, 1].

    Returns:
        ``[V]`` bool mask.
    """
    theta = make_params("nucleus", theta=theta).theta
    p = _dist(p, "p")
    if theta >= 1.0:
        return p > 0
    return (_mass_above(p) < theta) & (p > 0)


def tv(p: Any, q: Any) -> float:
    """Total variation ``½ Σ |p − q|`` (= R = Σ (q − p)_+ for distributions, THEORY §2.1)."""
    p, q = _pair(p, q)
    return float(0.5 * np.abs(p - q).sum())


def extra_acceptance(p: Any, q: Any, theta: float) -> float:
    """NSD extra acceptance ``E_S = Σ_{x ∈ N_θ(p)} (q(x) − p(x))_+`` (THEORY §2.3)."""
    p, q = _pair(p, q)
    return float(np.clip(q - p, 0, None)[nucleus_mask(p, theta)].sum())


def _extra_set(rule: str, p: np.ndarray, prm: Any, logits: Any) -> np.ndarray | None:
    """Token set S that a "ratio test or x ∈ S" rule accepts regardless of u."""
    if rule == "exact":
        return np.zeros(p.size, dtype=bool)
    if rule == "nucleus":
        return nucleus_mask(p, prm.theta)
    if rule == "topk":
        return (_rank(p) <= prm.top_k) & (p >= prm.ratio * p.max())
    if rule == "margin":
        with np.errstate(divide="ignore"):
            z = np.log(p) if logits is None else np.asarray(logits, dtype=np.float64)
        if z.shape != p.shape:
            raise ValueError(f"logits: shape {z.shape} != p shape {p.shape}")
        if p.size < 2:
            return np.zeros(p.size, dtype=bool)
        z1, z2 = np.sort(z)[::-1][:2]
        with np.errstate(divide="ignore", invalid="ignore"):
            undecided = bool(z2 / z1 > prm.logit_ratio)  # raw-logit ratio, as in rules.py
        return (_rank(p) <= 2) & undecided
    return None


def _typical_accept(p: np.ndarray, prm: Any) -> np.ndarray:
    """Tokens with p(x) > min(ε, δ·exp(−H(p))) (THEORY §2.5)."""
    h = -np.sum(p[p > 0] * np.log(p[p > 0]))
    return p > min(prm.epsilon, prm.delta * np.exp(-h))


def _divergence(p: np.ndarray, q: np.ndarray, kind: str) -> float:
    """D(p‖q) in nats (KL, Jensen–Shannon or TV), as rules.py computes it."""

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        m = a > 0
        if np.any(b[m] == 0):
            return float("inf")
        return float(np.sum(a[m] * np.log(a[m] / b[m])))

    if kind == "tv":
        return float(np.clip(q - p, 0, None).sum())
    if kind == "kl":
        return kl(p, q)
    m = 0.5 * (p + q)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def _argmax_onehot(p: np.ndarray) -> np.ndarray:
    out = np.zeros_like(p)
    out[int(np.argmax(p))] = 1.0  # first maximum, as torch.argmax
    return out


def acceptance_probability(rule: str, p: Any, q: Any, **params: Any) -> float:
    """Probability that a draft ``x ~ q`` is accepted at one position.

    Args:
        rule: ``exact``, ``greedy``, ``nucleus``, ``typical``, ``fuzzy``, ``margin`` or
            ``topk`` (``asd`` depends on the block and the ledger: not a one-position law).
        p: ``[V]`` target distribution.
        q: ``[V]`` draft distribution.
        **params: Rule parameters (``logits=`` for ``margin``; default ``log p``).

    Returns:
        The acceptance probability.
    """
    logits = params.pop("logits", None)
    p, q = _pair(p, q)
    if rule == "asd":
        raise ValueError("rule: 'asd' has no single-position acceptance law (block + ledger)")
    prm = make_params(rule, **params)
    if rule == "greedy":
        return float(q[int(np.argmax(p))])
    if rule == "typical":
        return float(q[_typical_accept(p, prm)].sum())
    if rule == "fuzzy":
        return 1.0 if _divergence(p, q, prm.divergence) <= prm.threshold else 0.0
    s = _extra_set(rule, p, prm, logits)
    return float(np.minimum(p, q).sum() + np.clip(q - p, 0, None)[s].sum())


def output_distribution(rule: str, p: Any, q: Any, **params: Any) -> np.ndarray:
    """Distribution of the token emitted at one position (draft if accepted, else recovery).

    Args:
        rule: ``exact``, ``greedy``, ``nucleus``, ``typical``, ``fuzzy``, ``margin`` or
            ``topk``.
        p: ``[V]`` target distribution.
        q: ``[V]`` draft distribution (the draft is drawn from it).
        **params: Rule parameters (``logits=`` for ``margin``; default ``log p``).

    Returns:
        ``[V]`` float64 output distribution.
    """
    logits = params.pop("logits", None)
    p, q = _pair(p, q)
    if rule == "asd":
        raise ValueError("rule: 'asd' has no single-position output law (block + ledger)")
    prm = make_params(rule, **params)
    if rule == "greedy":
        return _argmax_onehot(p)  # accept iff x = y*, else recover y*: always y*
    if rule == "typical":
        accept = _typical_accept(p, prm)
        return np.where(accept, q, 0.0) + (1.0 - q[accept].sum()) * _argmax_onehot(p)
    if rule == "fuzzy":
        return q.copy() if _divergence(p, q, prm.divergence) <= prm.threshold else p.copy()
    s = _extra_set(rule, p, prm, logits)
    surplus = np.clip(q - p, 0, None)  # (q − p)_+
    deficit = np.clip(p - q, 0, None)  # (p − q)_+, unnormalised residual
    r = surplus.sum()  # R
    e_s = surplus[s].sum()
    out = np.minimum(p, q) + np.where(s, surplus, 0.0)
    if r > 0:
        out = out + (r - e_s) * deficit / deficit.sum()
    return out


def expected_tokens_per_pass(alpha: Any, k: Any) -> Any:
    """E[τ] = (1 − α^{K+1}) / (1 − α) tokens per target pass; K + 1 at α = 1 (THEORY §1).

    The one E[τ] of the package (the audit's ``expected_tau`` is this function).

    Args:
        alpha: Per-position acceptance probability in [0, 1] (scalar or array; NaN stays
            NaN).
        k: Draft block length K >= 0 (scalar or array, broadcast against ``alpha``).

    Returns:
        A float for scalar inputs, else an array.
    """
    kk = np.asarray(k, dtype=np.float64)
    if np.any(kk < 0):
        raise ValueError(f"k: must be >= 0, got {k}")
    a = np.asarray(alpha, dtype=np.float64)
    if np.any((a < 0) | (a > 1)):
        raise ValueError("alpha: must be in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a == 1.0, kk + 1.0, (1.0 - a ** (kk + 1)) / (1.0 - a))
    return float(out) if out.ndim == 0 else out


def modelled_speedup(alpha: Any, k: Any, c: Any) -> Any:
    """Speedup over target-only decoding ≈ E[τ] / (1 + K·c) (THEORY §1).

    Args:
        alpha: Per-position acceptance probability (scalar or array).
        k: Draft block length K.
        c: Cost of one draft pass relative to one target pass (>= 0).
    """
    if np.any(np.asarray(c, dtype=np.float64) < 0):
        raise ValueError(f"c: must be >= 0, got {c}")
    out = expected_tokens_per_pass(alpha, k) / (1.0 + np.asarray(k, dtype=np.float64) * c)
    return float(out) if np.ndim(out) == 0 else out


def identical_output_bound(eps: Any, t: Any) -> Any:
    """Lower bound ``(1 − ε)^T`` on P(relaxed run ≡ exact run over T tokens) (THEORY §2.3)."""
    e = np.asarray(eps, dtype=np.float64)
    if np.any((e < 0) | (e > 1)):
        raise ValueError("eps: must be in [0, 1]")
    out = (1.0 - e) ** np.asarray(t, dtype=np.float64)
    return float(out) if np.ndim(out) == 0 else out
