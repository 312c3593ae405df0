"""The logging speculative decoder (one request through the engine) on tiny Llama and Qwen2 pairs.

Checks THEORY §1 (rounds, KV-cache rollback), §2.1 (exact is lossless), §2.2/§2.4 (greedy and
ASD with B = 0 reproduce the target's greedy output), §4 (coupled randomness), and the log
invariants of docs/ARCHITECTURE.md "Logs" (every emitted token logged once, accepted
lengths). Loading a pair is test_pair.py's, writing a run folder test_run.py's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
import torch
from scipy import stats

from relaxspec_audit import collect
from relaxspec_audit import verify as rules
from relaxspec_audit.collect import adapter, logs, roundlog
from relaxspec_audit.collect import round as round_
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig

PROMPTS = ["12+34=", "7*8=?", "abc", "z", "the sum of 5 and 9 is"]
#: The model adapters a Llama-family pair can decode through: FastLM (its own choice) and
#: transformers' own forward over its caches (forced).
ADAPTERS = {"static": None, "transformers": adapter.Adapter(adapter.TRANSFORMERS)}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pair(tiny) -> collect.Pair:
    return collect.make_pair(tiny.target, tiny.draft, tiny.tokenizer)


def _cfg(**kw) -> RunConfig:
    base = {"task": "x", "target": "t", "draft": "d", "k": 4, "max_new_tokens": 24}
    return RunConfig(**{**base, **kw}).validate()


def _generate(model, ids: list[int], n: int, **kw) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0, **kw
        )
    return out[0, len(ids) :].tolist()


# ------------------------------------------------------------------ greedy identity (§2.2, §2.4)


@pytest.mark.parametrize("via", ADAPTERS)
@pytest.mark.parametrize(
    "rule, params",
    [("greedy", {}), ("asd", {"budget": 0.0}), ("exact", {}), ("target", {})],
)
def test_greedy_matches_generate(tiny_pair, rule, params, via):
    pair = _pair(tiny_pair)
    cfg = _cfg(rule=rule, params=params, temperature=0.0)
    accepted = []
    for i, prompt in enumerate(PROMPTS):
        ids = pair.tokenizer(prompt)["input_ids"]
        ref = _generate(tiny_pair.target, ids, cfg.max_new_tokens)
        rows = collect.decode_request(pair, ids, cfg, f"r{i}", adapter=ADAPTERS[via])
        assert rows.request["output_ids"] == ref, (tiny_pair.arch, rule, prompt)
        accepted += rows.rounds["accepted"]
    if rule != "target":
        # the pair is correlated: the test exercises accepted drafts and full blocks (bonus)
        assert max(accepted) == cfg.k and sum(accepted) > 0.2 * len(accepted)


def test_greedy_stops_at_eos_like_generate(tiny_llama_pair):
    pair = _pair(tiny_llama_pair)
    ids = pair.tokenizer("12+34=")["input_ids"]
    ref = _generate(tiny_llama_pair.target, ids, 24)
    # make a token the target emits early an EOS: the round must be cut right after it
    eos = ref[5]
    pair = dataclasses.replace(pair, eos_ids=frozenset({eos}))
    for rule in ("greedy", "target"):
        rows = collect.decode_request(pair, ids, _cfg(rule=rule, temperature=0.0), "r")
        out = rows.request["output_ids"]
        assert out == ref[: ref.index(eos) + 1] and rows.request["stop"] == "eos"
        assert len(rows.positions["token"]) >= len(out)
        _check_request_logs(rows, k=4 if rule == "greedy" else 0, eos={eos})


def test_asd_budget_spends_and_ledger_logged(tiny_llama_pair):
    pair = _pair(tiny_llama_pair)
    cfg = _cfg(rule="asd", params={"budget": 8.0, "gate": 10.0, "cap": 4}, temperature=0.0)
    spent_final = []
    for i, prompt in enumerate(PROMPTS):
        rows = collect.decode_request(pair, pair.tokenizer(prompt)["input_ids"], cfg, f"r{i}")
        spent = rows.rounds["spent"]
        assert all(s is not None for s in spent) and spent == sorted(spent)
        assert spent[-1] <= 8.0 + 1e-9
        causes = rows.positions["cause"]
        n_exc = sum(c == "accept_exception" for c in causes)
        assert (n_exc > 0) == (spent[-1] > 0)
        spent_final.append(spent[-1])
        _check_request_logs(rows, k=cfg.k, eos=pair.eos_ids, max_new=cfg.max_new_tokens)
    assert max(spent_final) > 0  # some exception was accepted somewhere


@pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)
def test_embedded_pair_greedy_matches_generate():
    pair = collect.load_pair(
        str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu", "float32"
    )
    from relaxspec_audit import tasks

    task = tasks.load_task("arith", limit=4)
    for rule, params in (("greedy", {}), ("asd", {"budget": 0.0})):
        cfg = _cfg(rule=rule, params=params, temperature=0.0, max_new_tokens=32)
        for item in task.items:
            ids = collect.encode_prompt(pair, item.prompt)
            ref = _generate(pair.target, ids, 32, eos_token_id=sorted(pair.eos_ids))
            out = collect.decode_request(pair, ids, cfg, item.id).request["output_ids"]
            assert out == ref, (rule, item.id)


@pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)
def test_stopping_drafts_at_eos_changes_no_output(monkeypatch):
    """A block ends at a draft EOS (nothing after it can be emitted): outputs, and every
    row both runs log, equal those of blocks of K every round; only not-reached rows after
    the EOS disappear and the blocks (``rounds.k``) are shorter.
    """
    from relaxspec_audit import tasks

    pair = collect.load_pair(
        str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu", "float32"
    )
    items = tasks.load_task("arith", limit=6).items
    cases = [
        ("exact", {}, 1.0),
        ("nucleus", {"theta": 0.9}, 1.0),
        ("asd", {"budget": 8.0, "gate": 0.25, "cap": 2}, 0.0),
        # a loose gate: here a short block's own length would flip decisions (k_nominal)
        ("asd", {"budget": 100.0, "gate": 4.0, "cap": 5}, 0.0),
    ]
    drafted = {}
    for mode in ("off", "on"):
        monkeypatch.setattr(round_, "_END_BLOCK_AT_DRAFT_EOS", mode != "off")
        frames = {}
        for rule, params, temp in cases:
            cfg = _cfg(rule=rule, params=params, temperature=temp, k=5, max_new_tokens=32)
            for item in items:
                ids = collect.encode_prompt(pair, item.prompt)
                rows = collect.decode_request(pair, ids, cfg, item.id, timing=False)
                _check_request_logs(rows, k=5, eos=pair.eos_ids, max_new=32)
                frames[rule, str(params), item.id] = (
                    rows.request["output_ids"],
                    logs.to_frame("positions", rows.positions, "r", item.id),
                    sum(rows.rounds["k"]),
                )
        drafted[mode] = frames
    for key, (out_off, pos_off, k_off) in drafted["off"].items():
        out_step, pos_step, k_step = drafted["on"][key]
        assert out_step == out_off, key
        assert k_step <= k_off, key
        both = pos_off.join(pos_step, on=["round", "pos", "kind"], suffix="_s")
        assert both.height == pos_step.height, key  # every row logged is also logged off
        assert (both["token"] == both["token_s"]).all() and both["cause"].equals(
            both["cause_s"].alias("cause")
        ), key
        np.testing.assert_allclose(both["p"], both["p_s"], rtol=1e-5, atol=1e-6)
        dropped = pos_off.join(pos_step, on=["round", "pos", "kind"], how="anti")
        assert (dropped["cause"] == "not_reached").all(), key
    saved = sum(f[2] for f in drafted["off"].values()) - sum(f[2] for f in drafted["on"].values())
    assert saved > 0


# ------------------------------------------------------------------ lossless exact (§2.1)


def _exact_marginals(model, prompt: list[int], v: int, n: int) -> list[np.ndarray]:
    """Exact distribution of each of the first n emitted tokens under target sampling (T=1)."""
    with torch.inference_mode():
        seqs = torch.tensor([prompt])  # [S, L]
        weights = torch.ones(1, dtype=torch.float64)  # [S]
        marginals = []
        for _ in range(n):
            probs = torch.softmax(model(input_ids=seqs).logits[:, -1, :v].double(), -1)  # [S,V]
            joint = weights[:, None] * probs  # [S, V]
            marginals.append(joint.sum(0).numpy())
            seqs = torch.cat(
                [seqs.repeat_interleave(v, 0), torch.arange(v).repeat(seqs.shape[0])[:, None]], 1
            )
            weights = joint.flatten()
    return marginals


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit, cells with small expectation pooled into one."""
    n = counts.sum()
    expected = probs / probs.sum() * n
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


def _broken_exact(block, params, state):
    """`exact` with the classic bug of THEORY §2.1: recovery sampled from p, not (p − q)_+."""
    res = rules.RULES["exact"].fn(block, params, state)
    rows = torch.arange(res.accepted.shape[0])
    p_row = block.p[rows, res.accepted]
    from relaxspec_audit.verify.rng import sample_icdf

    res.token = sample_icdf(p_row, block.u_sample[rows, res.accepted])
    return res


def _first_tokens(pair, prompt, cfg, n_req, rule_fn=None) -> np.ndarray:
    out = np.empty((n_req, cfg.max_new_tokens), dtype=np.int64)
    for i in range(n_req):
        rows = collect.decode_request(pair, prompt, cfg, f"s{i}", timing=False, rule_fn=rule_fn)
        out[i] = rows.request["output_ids"][: cfg.max_new_tokens]
    return out


def test_exact_is_lossless_in_distribution_and_broken_variant_fails(tiny_qwen2_pair):
    """Chi-square of the first 3 emitted tokens vs the exact target marginals (THEORY §2.1).

    n = 500 requests, K = 2 (token 3 is a bonus or a second-round token). The broken
    variant (recovery from p) must be rejected by the same test: it shows the test has power.
    """
    pair = dataclasses.replace(_pair(tiny_qwen2_pair), eos_ids=frozenset())
    v = pair.vocab_size
    prompt = [1, 5]
    cfg = _cfg(rule="exact", temperature=1.0, k=2, max_new_tokens=3, log_positions=False)
    marg = _exact_marginals(tiny_qwen2_pair.target, prompt, v, 3)
    n_req = 500
    good = _first_tokens(pair, prompt, cfg, n_req)
    p_good = [_chi2_pvalue(np.bincount(good[:, j], minlength=v), marg[j]) for j in range(3)]
    assert min(p_good) > 0.001 / 3, p_good  # Bonferroni over the 3 positions
    bad = _first_tokens(pair, prompt, cfg, n_req, rule_fn=_broken_exact)
    p_bad = [_chi2_pvalue(np.bincount(bad[:, j], minlength=v), marg[j]) for j in range(3)]
    assert min(p_bad) < 1e-5, p_bad


# ------------------------------------------------------------------ coupling (§4)


def test_exact_and_nucleus_coupled(tiny_llama_pair):
    pair = _pair(tiny_llama_pair)
    same_when_no_extra = 0
    differ = 0
    for i, prompt in enumerate(PROMPTS * 3):
        ids = pair.tokenizer(prompt)["input_ids"]
        rid = f"c{i}"
        ex = collect.decode_request(pair, ids, _cfg(rule="exact", max_new_tokens=12), rid)
        nu = collect.decode_request(
            pair, ids, _cfg(rule="nucleus", params={"theta": 0.5}, max_new_tokens=12), rid
        )
        extra = any(
            c == "accept_nucleus" and a
            for c, a in zip(nu.positions["cause"], nu.positions["accepted"], strict=True)
        )
        if not extra:
            assert nu.request["output_ids"] == ex.request["output_ids"], rid
            same_when_no_extra += 1
        else:
            differ += nu.request["output_ids"] != ex.request["output_ids"]
    assert same_when_no_extra >= 2 and differ >= 1  # both branches were exercised


def test_same_seed_reproducible_other_seed_differs(tiny_llama_pair):
    pair = _pair(tiny_llama_pair)
    ids = pair.tokenizer("12+34=")["input_ids"]
    a = collect.decode_request(pair, ids, _cfg(rule="exact", seed=3), "r")
    b = collect.decode_request(pair, ids, _cfg(rule="exact", seed=3), "r")
    c = collect.decode_request(pair, ids, _cfg(rule="exact", seed=4), "r")
    assert a.request["output_ids"] == b.request["output_ids"]
    assert a.positions["u"].tolist() == b.positions["u"].tolist()
    assert a.request["output_ids"] != c.request["output_ids"]


# ------------------------------------------------------------------ logs of one request


def _check_request_logs(rows, k: int, eos=frozenset(), max_new: int = 24) -> None:
    """Every emitted token appears exactly once, in order; accepted lengths agree."""
    df = logs.to_frame("positions", rows.positions, "run", rows.request_id)
    rd = logs.to_frame("rounds", rows.rounds, "run", rows.request_id)
    out = rows.request["output_ids"]
    emitted = df.filter(
        ((pl.col("kind") == "draft") & pl.col("accepted")) | (pl.col("kind") != "draft")
    ).sort("abs_pos")
    assert emitted["token"].to_list() == out
    assert emitted["abs_pos"].to_list() == list(range(len(out)))
    assert rd["emitted"].sum() == len(out) == rows.request["n_tokens"]
    assert rd.height == rows.request["target_passes"]
    per_round = emitted.group_by("round").agg(
        (pl.col("kind") == "draft").sum().alias("acc"), pl.len().alias("n")
    )
    joined = rd.join(per_round, on="round").sort("round")
    assert joined["accepted"].to_list() == joined["acc"].to_list()
    assert joined["emitted"].to_list() == joined["n"].to_list()
    # K drafts per round, fewer only where drafting stopped at a draft EOS or the length limit
    assert (rd["k"] <= k).all()
    short = rd.filter(pl.col("k") < k)
    for rnd, start, k_r in short.select("round", "start_pos", "k").iter_rows():
        drafted = df.filter((pl.col("round") == rnd) & (pl.col("kind") == "draft")).sort("pos")
        at_eos = drafted.height == k_r and drafted["token"][-1] in eos
        assert at_eos or start + k_r == max_new, (rnd, k_r)
    # rounds tile the completion: each starts where the previous one ended
    assert rd["start_pos"].to_list() == [0, *np.cumsum(rd["emitted"].to_list())[:-1].tolist()]
    # a draft row is accepted exactly on the accepted prefix; causes are consistent
    drafts = df.filter(pl.col("kind") == "draft")
    assert (drafts["accepted"] == drafts["cause"].str.starts_with("accept")).all()


@pytest.mark.parametrize(
    "rule, params, temperature",
    [
        ("exact", {}, 1.0),
        ("nucleus", {"theta": 0.9}, 1.0),
        ("typical", {}, 1.0),
        ("fuzzy", {"divergence": "tv", "threshold": 0.3}, 1.0),
        ("margin", {}, 1.0),
        ("topk", {}, 0.7),
        ("exact", {}, 0.0),
        ("target", {}, 1.0),
    ],
)
def test_request_logs_consistent(tiny_qwen2_pair, rule, params, temperature):
    pair = _pair(tiny_qwen2_pair)
    cfg = _cfg(rule=rule, params=params, temperature=temperature, max_new_tokens=21, k=3)
    for i, prompt in enumerate(PROMPTS[:3]):
        rows = collect.decode_request(pair, pair.tokenizer(prompt)["input_ids"], cfg, f"r{i}")
        assert rows.request["n_tokens"] == 21 or rows.request["stop"] == "eos"
        _check_request_logs(rows, k=0 if rule == "target" else 3, eos=pair.eos_ids, max_new=21)
        df = logs.to_frame("positions", rows.positions, "run", rows.request_id)
        g = len(cfg.theta_grid)
        has_q = df.filter(pl.col("kind") != "bonus")
        assert has_q["es"].list.len().unique().to_list() == ([g] if has_q.height else [])
        assert (
            df.filter(pl.col("kind") == "bonus")["q"].null_count() == (df["kind"] == "bonus").sum()
        )
        assert ((df["p"] >= 0) & (df["p"] <= 1) & (df["p"] <= df["p_max"] + 1e-6)).all()


def test_truncated_round_logs_only_emitted(tiny_llama_pair):
    pair = _pair(tiny_llama_pair)
    for n in (1, 2, 3, 7):
        cfg = _cfg(rule="greedy", temperature=0.0, k=4, max_new_tokens=n)
        rows = collect.decode_request(pair, pair.tokenizer("12+34=")["input_ids"], cfg, "r")
        assert rows.request["n_tokens"] == n
        kinds = np.array(rows.positions["kind"])
        emitted = (kinds != "draft") | np.array([bool(a) for a in rows.positions["accepted"]])
        assert rows.positions["abs_pos"][emitted].max() == n - 1
        _check_request_logs(rows, k=4, eos=pair.eos_ids, max_new=n)


@pytest.mark.parametrize("rule, temperature", [("nucleus", 1.0), ("asd", 0.0)])
def test_batched_position_stats_equal_the_rule_full_diagnostics(
    tiny_qwen2_pair, monkeypatch, rule, temperature
):
    """Logged draft rows equal the rule's own full diagnostics of that round (THEORY §2).

    The decoder verifies with ``diagnostics=False`` and computes the statistics later,
    batched over rounds; here every round's block is re-run in full mode and compared,
    with the batch flushed every round and every 64 rounds (the result must not depend on
    the batching).
    """

    from relaxspec_audit.verify import DIAG_KEYS, RULES

    pair = _pair(tiny_qwen2_pair)
    cfg = _cfg(rule=rule, temperature=temperature, k=3, max_new_tokens=30)
    ids = pair.tokenizer("a long prompt: ")["input_ids"]
    assert set(DIAG_KEYS) == set(roundlog._STAT_KEYS) | set(roundlog._RULE_KEYS)
    outs = []
    for flush_rounds in (1, 64):
        monkeypatch.setattr(roundlog, "_FLUSH_MAX_ROUNDS", flush_rounds)
        full: list = []

        def spy(block, params, state, full=full):
            assert not block.diagnostics
            rich = dataclasses.replace(block, diagnostics=True)
            full.append((block, RULES[rule].fn(rich, params, state)))
            return RULES[rule].fn(block, params, state)

        rows = collect.decode_request(pair, ids, cfg, "r", timing=False, rule_fn=spy)
        df = logs.to_frame("positions", rows.positions, "run", "r")
        outs.append(df)
        for rnd, (block, res) in enumerate(full):
            got = df.filter((pl.col("round") == rnd) & (pl.col("kind") == "draft")).sort("pos")
            for key in DIAG_KEYS:
                want = res.diag[key][0, : got.height]
                if key == "cause":
                    want = [rules.Cause(int(c)).name.lower() for c in want]
                    assert got[key].to_list() == want, (rnd, key)
                else:
                    np.testing.assert_array_equal(got[key].to_numpy(), want.numpy(), err_msg=key)
            emit = df.filter((pl.col("round") == rnd) & (pl.col("kind") != "draft"))
            if emit.height:
                a = int(res.accepted)
                st = rules.token_stats(
                    block.p[0, a], None, block.target_logits[0, a], res.token[0], 0.95
                )
                for key in ("p", "p_max", "rank", "mass_above", "entropy_p", "regret"):
                    assert emit[key][0] == pytest.approx(float(st[key]), rel=1e-6), key
        assert len(full) == rows.request["target_passes"] > 3
    assert outs[0].equals(outs[1])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_target_only_rows_do_not_depend_on_batching(tiny_llama_pair, monkeypatch, temperature):
    """Target-only logging is batched too: flushing every 3 tokens or once gives equal rows."""
    pair = _pair(tiny_llama_pair)
    cfg = _cfg(rule="target", temperature=temperature, max_new_tokens=20)
    ids = pair.tokenizer("12+34=")["input_ids"]
    frames = []
    for floats in (roundlog._FLUSH_FLOATS, 3 * 2 * pair.vocab_size):
        monkeypatch.setattr(roundlog, "_FLUSH_FLOATS", floats)
        rows = collect.decode_request(pair, ids, cfg, "r", timing=False)
        frames.append(logs.to_frame("positions", rows.positions, "run", "r"))
        _check_request_logs(rows, k=0, eos=pair.eos_ids, max_new=20)
    assert frames[0].height == 20 and frames[0].equals(frames[1])
    assert (frames[0]["kind"] == "bonus").all() and frames[0]["q"].null_count() == 20
    assert (frames[0]["rank"] >= 1).all() and (frames[0]["p"] <= frames[0]["p_max"]).all()


def test_logging_off_gives_same_output(tiny_llama_pair):
    pair = _pair(tiny_llama_pair)
    ids = pair.tokenizer("7*8=?")["input_ids"]
    on = collect.decode_request(pair, ids, _cfg(rule="nucleus"), "r")
    off = collect.decode_request(pair, ids, _cfg(rule="nucleus", log_positions=False), "r")
    assert on.request["output_ids"] == off.request["output_ids"]
    assert off.positions == {} and off.rounds["accepted"] == on.rounds["accepted"]


# ------------------------------------------------------------------ KV cache crop (§1)


@pytest.mark.parametrize("via", ADAPTERS)
def test_kv_crop_matches_no_cache_recompute(tiny_pair, via):
    """Logged p and q of every emitted token equal a no-cache forward over the final text,
    through either adapter (FastLM's implicit rollback, transformers' caches cropped)."""
    pair = _pair(tiny_pair)
    cfg = _cfg(rule="nucleus", params={"theta": 0.9}, k=4, max_new_tokens=30)
    ids = pair.tokenizer("the sum of 5 and 9 is")["input_ids"]
    rows = collect.decode_request(pair, ids, cfg, "kv", adapter=ADAPTERS[via])
    out = rows.request["output_ids"]
    assert len(set(rows.rounds["accepted"])) > 1  # crops of different lengths happened
    seq = torch.tensor([ids + out])
    with torch.inference_mode():
        p_all = torch.softmax(tiny_pair.target(input_ids=seq).logits[0].double(), -1)
        q_all = torch.softmax(tiny_pair.draft(input_ids=seq).logits[0].double(), -1)
    df = logs.to_frame("positions", rows.positions, "run", "kv").filter(
        (pl.col("kind") != "draft") | pl.col("accepted")
    )
    at = len(ids) - 1 + df["abs_pos"].to_numpy()  # logits row predicting each token
    tok = df["token"].to_numpy()
    p_ref = p_all[torch.from_numpy(at.copy()), torch.from_numpy(tok.copy())].numpy()
    assert np.abs(df["p"].to_numpy() - p_ref).max() < 1e-4
    has_q = df["q"].is_not_null().to_numpy()
    q_ref = q_all[torch.from_numpy(at[has_q]), torch.from_numpy(tok[has_q])].numpy()
    assert np.abs(df["q"].to_numpy()[has_q] - q_ref).max() < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run benchmarks/gpu.sh)")
def test_cuda_greedy_matches_generate_and_logs(tiny_llama_pair):
    import copy

    dev = torch.device("cuda")
    target = copy.deepcopy(tiny_llama_pair.target).to(dev)
    draft = copy.deepcopy(tiny_llama_pair.draft).to(dev)
    pair = collect.make_pair(target, draft, tiny_llama_pair.tokenizer)
    assert pair.device.type == "cuda"
    cfg = _cfg(rule="greedy", temperature=0.0)
    for i, prompt in enumerate(PROMPTS):
        ids = pair.tokenizer(prompt)["input_ids"]
        with torch.inference_mode():
            ref = target.generate(
                torch.tensor([ids], device=dev), max_new_tokens=24, do_sample=False, pad_token_id=0
            )[0, len(ids) :].tolist()
        rows = collect.decode_request(pair, ids, cfg, f"r{i}")
        assert rows.request["output_ids"] == ref
        _check_request_logs(rows, k=cfg.k, eos=pair.eos_ids)
    rows = collect.decode_request(pair, ids, _cfg(rule="nucleus"), "s")
    _check_request_logs(rows, k=cfg.k, eos=pair.eos_ids)
    assert all(t > 0 for t in rows.rounds["verify_s"])


def test_transform_logits_topk_topp():
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    p = collect.transform_logits(z, 1.0, top_k=2)
    assert (p[0, 2:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    full = torch.softmax(z, -1)[0]
    p = collect.transform_logits(z, 1.0, top_p=float(full[0] + 1e-3))
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    g = collect.transform_logits(z, 0.0, top_k=1)  # greedy mode: temperature-1 softmax
    assert torch.allclose(g, torch.softmax(z, -1))
    hot = collect.transform_logits(z, 2.0)
    assert torch.allclose(hot, torch.softmax(z / 2, -1))


@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])
def test_es_grid_topm_equals_full_es_grid(scale):
    """The top-m shortcut for E_S (THEORY §2.3) is exact, flat rows included (fallback)."""
    grid = [0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99]
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(4, 3, 700, generator=gen) * scale
    p = torch.softmax(z, -1)
    q = torch.softmax(z + torch.randn(z.shape, generator=gen), -1)
    p[0, 0] = 0.0  # ties: ten tokens of 0.05, fifty of 0.01
    p[0, 0, :10], p[0, 0, 10:60] = 0.05, 0.01
    full = rules.es_grid(p, q, grid).numpy()
    fast = roundlog.es_grid_topm(p, q, grid, m=32)
    np.testing.assert_array_equal(fast, full)
