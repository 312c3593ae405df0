"""Property-based checks of the block rules (hypothesis; THEORY §2, ARCHITECTURE `rules.py`)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaxspec_audit import verify as rules
from relaxspec_audit.verify import Block, Cause, make_params
from relaxspec_audit.verify.rng import sample_icdf

ACCEPT_CAUSES = {c for c in Cause if c.name.startswith("ACCEPT_")}
REJECT_CAUSES = {c for c in Cause if c.name.startswith("REJECT_")}
SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@st.composite
def blocks(draw):
    """Random blocks: B ≤ 3, K ≤ 5, V ≤ 7; integer logits give ties; zeros in p sometimes."""
    seed = draw(st.integers(0, 2**31 - 1))
    b, k, v = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(2, 7))
    ties, greedy, sparse = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(b, k + 1, v, generator=g) * 2
    if ties:
        z = z.round()
    p = z.softmax(-1)
    if sparse:  # keep the top 2 per row (a top-k sampling transform): zeros in p
        keep = p >= p.topk(2, dim=-1).values[..., -1:]
        p = torch.where(keep, p, 0.0)
        p = p / p.sum(-1, keepdim=True)
    q = (torch.randn(b, k, v, generator=g) * 2).softmax(-1)
    u_draft = torch.rand(b, k, generator=g)
    drafts = q.argmax(-1) if greedy else sample_icdf(q, u_draft)
    return Block(
        drafts=drafts,
        p=p,
        q=q,
        target_logits=z,
        u_accept=torch.rand(b, k, generator=g),
        u_sample=torch.rand(b, k + 1, generator=g),
        greedy=greedy,
    )


def _run(rule, block, **kw):
    return rules.RULES[rule].fn(block, make_params(rule, **kw), None)


def _check_structure(block, res):
    k = block.k
    a = res.accepted
    assert a.dtype == torch.int64
    assert bool(((a >= 0) & (a <= k)).all())
    acc = res.diag["accepted"]
    # diag["accepted"] is exactly the prefix of length a.
    assert torch.equal(acc, torch.arange(k).unsqueeze(0) < a.unsqueeze(1))
    cause = res.diag["cause"]
    for i in range(block.drafts.shape[0]):
        ai = int(a[i])
        assert all(int(c) in ACCEPT_CAUSES for c in cause[i, :ai])
        if ai < k:
            assert int(cause[i, ai]) in REJECT_CAUSES
            assert all(int(c) == Cause.NOT_REACHED for c in cause[i, ai + 1 :])


@SETTINGS
@given(blocks(), st.sampled_from(sorted(rules.RULES)))
def test_structure_of_every_rule(block, rule):
    res = _run(rule, block)
    _check_structure(block, res)
    # The emitted token is never impossible under the target.
    rows = torch.arange(block.drafts.shape[0])
    p_emit = block.p[rows, res.accepted].gather(-1, res.token.unsqueeze(-1))
    if not block.greedy and not rules.RULES[rule].greedy_only:
        assert bool((p_emit > 0).all())


@SETTINGS
@given(blocks(), st.sampled_from([0.3, 0.8, 0.95, 1.0]))
def test_relaxations_accept_a_superset_of_exact(block, theta):
    """Same uniforms: nucleus/topk/margin accept all that exact accepts (THEORY §2.3, §2.5)."""
    exact = _run("exact", block)
    for rule, kw in (("nucleus", {"theta": theta}), ("topk", {}), ("margin", {})):
        res = _run(rule, block, **kw)
        assert bool((res.accepted >= exact.accepted).all()), rule
        assert bool((res.diag["accepted"] | ~exact.diag["accepted"]).all()), rule
        # Where the lengths agree, the rejection path is the same code with the same u.
        same = res.accepted == exact.accepted
        assert torch.equal(res.token[same], exact.token[same]), rule


@SETTINGS
@given(blocks())
def test_greedy_emits_target_argmax(block):
    res = _run("greedy", block)
    argmax = block.target_logits.argmax(-1)  # [B, K+1], first maximum
    rows = torch.arange(block.drafts.shape[0])
    assert torch.equal(res.token, argmax[rows, res.accepted])
    acc = res.diag["accepted"]
    assert bool((block.drafts[acc] == argmax[:, : block.k][acc]).all())
    # The first rejected draft really differs from the argmax.
    rej = res.accepted < block.k
    first = block.drafts[rows[rej], res.accepted[rej]]
    assert bool((first != argmax[rows[rej], res.accepted[rej]]).all())


@SETTINGS
@given(
    blocks(),
    st.floats(0.0, 10.0),
    st.sampled_from([0.0, 0.1, 0.25, 1.0, float("inf")]),
    st.sampled_from([0, 1, 2, float("inf")]),
    st.floats(0.0, 10.0),
)
def test_asd_bounds(block, budget, gate, cap, spent):
    """ASD ⊇ greedy; spends only within budget; ledger += C_a (THEORY §2.4)."""
    state = torch.full((block.drafts.shape[0],), spent, dtype=torch.float64)
    prm = make_params("asd", budget=budget, gate=gate, cap=cap)
    res = rules.RULES["asd"].fn(block, prm, state)
    _check_structure(block, res)
    greedy = _run("greedy", block)
    assert bool((res.accepted >= greedy.accepted).all())
    delta = res.state - state
    assert bool((delta >= 0).all())
    # Spending is only allowed when it fits: new ledger ≤ budget unless nothing was spent.
    assert bool(((delta == 0) | (res.state <= budget + 1e-9)).all())
    exceptions = (res.diag["cause"] == Cause.ACCEPT_EXCEPTION).sum(1)
    assert bool((exceptions <= cap).all())
    regret = torch.where(res.diag["cause"] == Cause.ACCEPT_EXCEPTION, res.diag["regret"], 0.0)
    torch.testing.assert_close(delta, regret.sum(1).to(torch.float64), atol=1e-5, rtol=1e-5)
    if budget == 0:
        assert torch.equal(res.accepted, greedy.accepted)


@SETTINGS
@given(blocks(), st.sampled_from(sorted(rules.RULES)), st.data())
def test_ragged_lengths_decide_as_the_truncated_block(block, rule, data):
    """``Block.lengths`` (a batched decoder's per-row block ends) decides row b exactly as
    the block of its first k_b drafts: same accepted length, token, causes and ASD ledger."""
    import dataclasses

    b, k = block.drafts.shape
    lengths = torch.tensor([data.draw(st.integers(1, k)) for _ in range(b)])
    spec = rules.RULES[rule]
    kw = {"budget": 3.0, "gate": 1.0, "cap": 2} if rule == "asd" else {}
    if spec.greedy_only:
        block = dataclasses.replace(block, greedy=True)
    state = torch.full((b,), 0.5, dtype=torch.float64) if rule == "asd" else None
    prm = make_params(rule, **kw)
    ragged = spec.fn(dataclasses.replace(block, lengths=lengths, k_nominal=k), prm, state)
    for i in range(b):
        n = int(lengths[i])
        row = Block(
            drafts=block.drafts[i : i + 1, :n],
            p=block.p[i : i + 1, : n + 1],
            q=block.q[i : i + 1, :n],
            target_logits=block.target_logits[i : i + 1, : n + 1],
            u_accept=block.u_accept[i : i + 1, :n],
            u_sample=block.u_sample[i : i + 1, : n + 1],
            greedy=block.greedy,
            k_nominal=k,
        )
        one = spec.fn(row, prm, None if state is None else state[i : i + 1])
        assert int(ragged.accepted[i]) == int(one.accepted[0])
        assert int(ragged.token[i]) == int(one.token[0])
        assert torch.equal(ragged.diag["cause"][i, :n], one.diag["cause"][0])
        assert bool((ragged.diag["cause"][i, n:] == Cause.NOT_REACHED).all())
        if state is not None:
            assert float(ragged.state[i]) == pytest.approx(float(one.state[0]), abs=1e-12)
