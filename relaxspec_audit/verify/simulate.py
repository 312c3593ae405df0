"""One position or one block through the batched rule code, from plain arrays.

:func:`simulate_position` draws many drafts at one position and returns what a rule emits
(Monte Carlo checks of THEORY §2's single-position laws use it); :func:`asd_accept_length`
runs ASD's feasibility and ledger on one block (THEORY §2.4). Both call the same rule
functions the decoder calls, so they test the code that runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from relaxspec_audit.verify.block import Block
from relaxspec_audit.verify.registry import RULES, make_params
from relaxspec_audit.verify.rules import rule_asd

__all__ = ["asd_accept_length", "simulate_position"]


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

    from relaxspec_audit.verify.rng import Purpose, sample_icdf, uniforms

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
    res = rule_asd(block, prm, torch.tensor([float(spent)], dtype=torch.float64))
    return int(res.accepted[0]), float(res.state[0])
