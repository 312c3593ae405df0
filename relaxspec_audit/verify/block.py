"""The block interface of every verification rule: its inputs, outputs and causes.

A rule sees one verification block: ``K`` drafts, the target's ``K+1`` distributions from
one forward pass, the draft's ``K`` distributions, the raw target logits and the keyed
uniforms (THEORY §1, §4). It returns the accepted prefix length, the emitted token and
per-position diagnostics with one :class:`Cause` each. Shapes are ``[B, K, V]``.

torch is only a type here, so :class:`Cause` is importable on the lightweight path.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["DIAG_KEYS", "TOKEN_STAT_KEYS", "Block", "BlockResult", "Cause"]

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


class Cause(enum.IntEnum):
    """Why a position was accepted or rejected; ``name.lower()`` is the string in the logs.

    The one closed enumeration of causes (docs/ARCHITECTURE.md "Causes").
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
        lengths: ``[B]`` int64 per-row block lengths ``k_b ≤ K`` (a batched decoder drafts K
            for every row but a row's block ends at its draft EOS or length limit). Row
            ``b`` is decided exactly as the block of its first ``k_b`` drafts: positions
            ``≥ k_b`` are never accepted (cause ``NOT_REACHED``) and a fully accepted row
            takes its bonus from ``p[k_b]``. None: every row has length K.
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
    lengths: Tensor | None = None

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
        if self.lengths is not None and tuple(self.lengths.shape) != (b,):
            raise ValueError(
                f"Block.lengths: expected shape ({b},), got {tuple(self.lengths.shape)}"
            )
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
