"""The engine (project issues 12, 28): B requests per target pass through either model adapter.

The contract (THEORY §4, "Batching"): what a request draws does not depend on its
batch-mates (keyed uniforms), but float results do (a row's matmul differs between 1, 2
and ≥ 5 rows), and so do they between the two model adapters (FastLM's static caches and
transformers' own forward over its caches). So a request's log at batch size B through
either adapter agrees with its one-request log through transformers' own forward in float
columns within a tolerance, and in discrete columns and output ids up to the first
near-tie: a position whose decision margin is below that tolerance. Every first
difference must sit at a flagged near-tie.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from relaxspec_audit import collect, tasks
from relaxspec_audit.collect import adapter, batched, fastmodel
from relaxspec_audit.collect.batched import decode_request
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig
from relaxspec_audit.collect.pair import DecodeError
from relaxspec_audit.collect.stops import StopStrings
from relaxspec_audit.verify.registry import RULES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Float tolerances of the contract: probabilities; log-probability columns. An entropy
# H = E_p[-log p] carries the log-probabilities' error, not the probabilities': with the
# six-block embedded target a batch moves it by up to 1.3e-5 where p moves < 1e-5.
TOL_P = 1e-5
TOL_LOGIT = 1e-4
LOGIT_COLS = ("regret", "logp_target", "entropy_p", "entropy_q")
DISCRETE_POS = ("kind", "token", "target_argmax", "rank", "passed_ratio", "in_nucleus",
                "accepted", "cause", "round", "pos", "abs_pos")  # fmt: skip
DISCRETE_ROUNDS = ("round", "start_pos", "k", "accepted", "emitted")
#: The transformers-cache adapter, forced on a Llama pair that FastLM could serve.
HF = adapter.Adapter(adapter.TRANSFORMERS)
#: The adapters a pair's engine can run: its own choice (FastLM here), and HF.
ADAPTERS = {"static": None, "transformers": HF}


@pytest.fixture(scope="module")
def pair():
    return collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")


def _requests(pair, task: str, n: int) -> list[tuple[str, list[int]]]:
    items = tasks.load_task(task, limit=n).items
    return [(it.id, collect.encode_prompt(pair, it.prompt)) for it in items]


def _cfg(rule: str, **kw) -> RunConfig:
    temperature = 0.0 if rule == "target" or RULES.get(rule, RULES["greedy"]).greedy_only else 1.0
    base = dict(rule=rule, k=4, max_new_tokens=20, device="cpu", temperature=temperature)
    return RunConfig(**{**base, **kw})


def one_by_one(pair, reqs, config: RunConfig, stops=None) -> dict:
    """The reference logs: one request at a time through transformers' own forward."""
    return {rid: decode_request(pair, ids, config, rid, stops=stops, adapter=HF)
            for rid, ids in reqs}  # fmt: skip


def _float(values) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def near_tie(pos: dict, i: int, config: RunConfig, tol: float = TOL_LOGIT) -> bool:
    """Whether position ``i`` of a one-request log was decided within ``tol`` of a boundary.

    The margins of THEORY §4: the ratio test ``|u − min(1, p/q)|``; a greedy match decided
    by a logit gap (the draft's regret, or the target's top two via ``p_max``); the nucleus
    boundary ``|mass_above − θ|``; ASD's gate slack ``|r/(K − i) − g|``; and for a sampled
    recovery or bonus token, the inverse-CDF boundary (``u`` within ``tol`` of a cumulative
    mass, bounded here by the token's own probability mass interval being unknown: such a
    position counts as a near-tie only when ``p(token) < tol`` or ``u`` is within ``tol``
    of 0 or 1).
    """
    u, p, q = pos["u"][i], pos["p"][i], pos["q"][i]
    regret, mass = pos["regret"][i], pos["mass_above"][i]
    if pos["kind"][i] == "draft":
        if u is not None and p is not None and q:
            if abs(u - min(1.0, p / q)) < tol:
                return True
        if regret is not None and regret < tol:  # the draft ties the target's argmax
            return True
        spec = RULES.get(config.rule)
        if spec is not None and spec.nucleus_param and mass is not None:
            if abs(mass - spec.nucleus_theta(config.params)) < tol:
                return True
        if config.rule == "asd" and regret is not None:
            remaining = config.k - pos["pos"][i]
            if abs(regret / remaining - config.params.gate) < tol:
                return True
        return False
    return (p is not None and p < tol) or (u is not None and min(u, 1 - u) < tol)


def assert_same_up_to_near_tie(one, many, config: RunConfig) -> None:
    """The contract for one request: floats within tolerance, discrete columns identical
    up to the first near-tie, and every first difference at a flagged near-tie."""
    a_out, b_out = one.request["output_ids"], many.request["output_ids"]
    n = len(a_out)
    if a_out != b_out:
        first = next(j for j, (x, y) in enumerate(zip(a_out, b_out, strict=False)) if x != y)
        # The first difference is decided at a row of the round that emitted token `first`.
        rows = [i for i, ap in enumerate(one.positions["abs_pos"]) if ap <= first]
        assert any(near_tie(one.positions, i, config) for i in rows), (
            f"{one.request_id}: outputs differ at token {first} with no near-tie"
        )
        n = first
    # Compare every row before the first divergence.
    keep = [i for i, ap in enumerate(one.positions.get("abs_pos", [])) if ap < n]
    for col in DISCRETE_POS:
        if col not in one.positions:
            continue
        x = [one.positions[col][i] for i in keep]
        y = [many.positions[col][i] for i in keep]
        assert x == y, (one.request_id, col)
    if "es" in one.positions:  # E_S on the θ grid: a list per row (null on bonus rows)
        for i in keep:
            x, y = one.positions["es"][i], many.positions["es"][i]
            assert (x is None) == (y is None), (one.request_id, "es", i)
            if x is not None:
                np.testing.assert_allclose(_float(x), _float(y), atol=TOL_P, err_msg="es")
    for col, values in one.positions.items():
        if col in DISCRETE_POS or col == "es":
            continue
        tol = TOL_LOGIT if col in LOGIT_COLS else TOL_P
        x = _float([values[i] for i in keep])
        y = _float([many.positions[col][i] for i in keep])
        np.testing.assert_allclose(x, y, atol=tol, rtol=0, equal_nan=True, err_msg=col)
    if a_out == b_out:
        for col in DISCRETE_ROUNDS:
            assert list(one.rounds[col]) == list(many.rounds[col]), (one.request_id, col)
        if config.rule == "asd":
            np.testing.assert_allclose(
                _float(one.rounds["spent"]), _float(many.rounds["spent"]), atol=TOL_LOGIT
            )
        assert one.request["stop"] == many.request["stop"]
        assert one.request["target_passes"] == many.request["target_passes"]


SETTINGS = [
    ("exact", {}),
    ("greedy", {}),
    ("nucleus", {"theta": 0.8}),
    ("asd", {"budget": 2.0}),
    ("typical", {}),
    ("fuzzy", {"threshold": 0.3}),
    ("margin", {}),
    ("topk", {}),
    ("target", {}),
]


@pytest.mark.parametrize("rule, params", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_batched_logs_equal_one_request_logs_up_to_near_ties(pair, rule, params):
    """Every rule (the ASD ledger too), 12 requests: FastLM at batch sizes 1, 2, 5 and 16, and
    the transformers-cache adapter at batch 5, against the one-request logs through
    transformers' own forward. Rows end at different times (EOS at different lengths, the
    length limit) and slots are refilled mid-batch (B < 12), their caches with them."""
    config = _cfg(rule, params=params)
    reqs = _requests(pair, "arith", 8) + _requests(pair, "story", 4)  # story hits the limit
    one = one_by_one(pair, reqs, config)
    assert {r.request["stop"] for r in one.values()} == {"eos", "length"}
    for b, via in ((1, None), (2, None), (5, None), (16, None), (5, HF)):
        many = {r.request_id: r for r in batched.decode_batched(pair, reqs, config, b,
                                                                adapter=via)}  # fmt: skip
        assert set(many) == set(one)
        for rid in one:
            assert_same_up_to_near_tie(one[rid], many[rid], config)


@pytest.mark.parametrize("via", ADAPTERS)
@pytest.mark.parametrize(
    "rule, params", [("exact", {}), ("asd", {"budget": 0.25}), ("target", {})], ids=str
)
def test_a_draining_batch_narrows_and_its_rows_keep_their_caches_and_ledgers(
    pair, monkeypatch, rule, params, via
):
    """After the last request, the batch halves while at most half its rows are live: the
    live rows beyond the new width move (K/V of both models, the ASD ledger) into free
    rows, through either adapter. Their logs stay one-request logs up to near-ties; a row
    that moved without its cache would attend to another request's keys, one without its
    ledger would log a wrong ``spent`` (B = 0.25 binds on arith) and decide other
    exceptions."""
    config = _cfg(rule, params=params)
    reqs = _requests(pair, "arith", 8) + _requests(pair, "story", 4)
    moves: list[list[int]] = []
    lm = fastmodel.FastLM if via == "static" else adapter.CacheLM
    move_rows = lm.move_rows

    def spy(self, src, dst):
        moves.append(list(src))
        move_rows(self, src, dst)

    monkeypatch.setattr(lm, "move_rows", spy)
    longest = max(len(ids) for _, ids in reqs)
    engine = batched.BatchedEngine(pair, config, 8, longest, adapter=ADAPTERS[via])
    many = {r.request_id: r for r in engine.run(reqs)}
    widths = [8, *engine.widths]
    assert len(widths) > 2 and widths == sorted(set(widths), reverse=True), widths
    assert any(moves), moves  # some live row sat beyond a new width
    one = one_by_one(pair, reqs, config)
    if rule == "asd":  # the ledger bound somewhere: a lost one would show
        assert any(c == "reject_budget" for r in one.values() for c in r.positions["cause"])
    for rid in one:
        assert_same_up_to_near_tie(one[rid], many[rid], config)
    unnarrowed = batched.BatchedEngine(pair, config, 8, 64, narrow=False, adapter=ADAPTERS[via])
    wide = {r.request_id: r for r in unnarrowed.run(reqs)}
    assert {rid: r.request["output_ids"] for rid, r in wide.items()} == {
        rid: r.request["output_ids"] for rid, r in many.items()
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run benchmarks/gpu.sh)")
@pytest.mark.parametrize("which", ["embedded", "tiny_llama"])
def test_cuda_batched_logs_equal_one_request_logs_up_to_near_ties(which, request):
    """The batching contract on CUDA (float32), for the embedded pair and a grouped-query
    pair (``enable_gqa``, as the GPU benchmarks' model), greedy and exact, with refills
    and narrowing at batch 5; graph replay must then log the eager engine's outputs."""
    import copy

    if which == "embedded":
        cuda = collect.load_pair(
            str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cuda", "float32"
        )
        reqs = _requests(cuda, "arith", 8) + _requests(cuda, "story", 4)
    else:
        tiny = request.getfixturevalue("tiny_llama_pair")
        target = copy.deepcopy(tiny.target).to("cuda")
        draft = copy.deepcopy(tiny.draft).to("cuda")
        cuda = collect.make_pair(target, draft, tiny.tokenizer)
        gen = torch.Generator().manual_seed(11)
        reqs = [(f"r{i}", torch.randint(3, 60, (3 + i,), generator=gen).tolist()) for i in range(9)]
    for rule in ("greedy", "exact"):
        config = _cfg(rule, device="cuda")
        one = one_by_one(cuda, reqs, config)
        longest = max(len(ids) for _, ids in reqs)
        engine = batched.BatchedEngine(cuda, config, 5, longest)
        many = {r.request_id: r for r in engine.run(reqs)}
        assert engine.widths, "the batch never narrowed"
        for rid in one:
            assert_same_up_to_near_tie(one[rid], many[rid], config)
        graphed = RunConfig(**{**config.to_dict(), "cuda_graphs": True})
        replayed = {r.request_id: r for r in batched.decode_batched(cuda, reqs, graphed, 5)}
        for rid, rows in many.items():
            assert rows.request["output_ids"] == replayed[rid].request["output_ids"], (rule, rid)


@pytest.mark.parametrize("rule, params", [("exact", {}), ("asd", {"budget": 0.25}), ("target", {})])
def test_calls_attend_a_window_that_covers_every_position_they_feed(
    pair, monkeypatch, rule, params
):
    """Every call attends the cache slots below its furthest real position, rounded up to
    ``kv_block`` (8 here, so windows grow within a request and differ across a batch),
    never the whole cache: each real position of a call lies inside its window (a position
    outside would lose keys it must see), and the logs stay one-request logs up to
    near-ties. Prefills of refilled rows, draft steps, verify and target-only steps alike."""
    config = _cfg(rule, params=params)
    reqs = _requests(pair, "arith", 8) + _requests(pair, "story", 4)
    calls: list[tuple[int | None, int]] = []  # (kv_len, furthest real position)
    forward = fastmodel.FastLM.forward

    def spy(self, ids, input_pos, rows=None, keep=None, kv_len=None):
        real = input_pos[input_pos < self.scratch]
        calls.append((kv_len, int(real.max()) if real.numel() else -1))
        return forward(self, ids, input_pos, rows=rows, keep=keep, kv_len=kv_len)

    monkeypatch.setattr(fastmodel.FastLM, "forward", spy)
    engine = batched.BatchedEngine(pair, config, 5, max(len(ids) for _, ids in reqs))
    engine.kv_block = 8
    many = {r.request_id: r for r in engine.run(reqs)}
    assert all(kv is not None and furthest < kv for kv, furthest in calls), calls
    windows = {kv for kv, _ in calls}
    assert (
        len(windows) > 3
        and min(windows) < engine.s_max
        and all(w % 8 == 0 or w == engine.s_max for w in windows)
    )
    monkeypatch.undo()
    one = one_by_one(pair, reqs, config)
    for rid in one:
        assert_same_up_to_near_tie(one[rid], many[rid], config)


@pytest.mark.parametrize("via", ADAPTERS)
def test_an_engine_serves_run_after_run_alike(pair, via):
    """One engine, its caches kept, decodes the same requests twice to the same logs: the
    rule state (ASD ledgers, narrowed to the last run's width) starts afresh each run, and
    stale K/V of the previous run is never attended (benchmarks time a reused engine)."""
    config = _cfg("asd", params={"budget": 0.25})
    reqs = _requests(pair, "arith", 8) + _requests(pair, "story", 4)
    longest = max(len(ids) for _, ids in reqs)
    engine = batched.BatchedEngine(pair, config, 8, longest, adapter=ADAPTERS[via])
    first = {r.request_id: r for r in engine.run(reqs)}
    widths = list(engine.widths)
    second = {r.request_id: r for r in engine.run(reqs)}
    assert widths and engine.widths == widths
    for rid, rows in first.items():
        assert rows.request["output_ids"] == second[rid].request["output_ids"], rid
        assert list(rows.rounds["spent"]) == list(second[rid].rounds["spent"]), rid
        np.testing.assert_array_equal(
            _float(rows.positions["p"]), _float(second[rid].positions["p"])
        )


def test_sampling_mode_greedy_rules_and_temperature(pair):
    """Sampling at temperature 0.7 with top-p (the transform both models share)."""
    config = _cfg("nucleus", params={"theta": 0.9}, temperature=0.7, top_p=0.95)
    reqs = _requests(pair, "story", 6)
    one = one_by_one(pair, reqs, config)
    for via in ADAPTERS.values():
        many = {r.request_id: r for r in batched.decode_batched(pair, reqs, config, 4,
                                                                adapter=via)}  # fmt: skip
        for rid in one:
            assert_same_up_to_near_tie(one[rid], many[rid], config)


@pytest.mark.parametrize("via", ADAPTERS)
@pytest.mark.parametrize("rule, params", [("greedy", {}), ("asd", {"budget": 0.0})])
def test_greedy_batched_equals_generate_per_row(pair, rule, params, via):
    """Strict greedy verification at batch 5 is token for token the target's own greedy
    output (THEORY §2.2), as transformers' ``generate(do_sample=False)`` gives per row,
    through either adapter."""
    config = _cfg(rule, params=params, max_new_tokens=16)
    reqs = _requests(pair, "arith", 7)
    many = {r.request_id: r for r in batched.decode_batched(pair, reqs, config, 5,
                                                            adapter=ADAPTERS[via])}  # fmt: skip
    for rid, ids in reqs:
        with torch.no_grad():
            out = pair.target.generate(
                torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                pad_token_id=pair.tokenizer.pad_token_id,
            )  # fmt: skip
        ref = out[0, len(ids) :].tolist()
        eos = next((j for j, t in enumerate(ref) if t in pair.eos_ids), None)
        ref = ref if eos is None else ref[: eos + 1]
        assert many[rid].request["output_ids"] == ref, rid


def test_exact_stays_lossless_at_batch_16(pair):
    """THEORY §2.1: exact's first emitted token is distributed as p, batched too.

    2,000 requests on one story prompt (each request id its own random stream), batch 16,
    one token each; chi-square of the first token against the target's p over the tokens
    with expected count ≥ 5 (others pooled). Seeded by the request ids; the test has power
    against a wrong recovery (sampling p instead of the residual moves the law by TV 0.02+
    on this prompt, THEORY §2.1's classic bug).
    """
    config = _cfg("exact", max_new_tokens=1, temperature=1.0, log_positions=False)
    prompt = collect.encode_prompt(pair, tasks.load_task("story", limit=1).items[0].prompt)
    n = 2000
    reqs = [(f"mc-{i:05d}", prompt) for i in range(n)]
    first = [r.request["output_ids"][0] for r in batched.decode_batched(pair, reqs, config, 16)]
    with torch.no_grad():
        p = torch.softmax(pair.target(torch.tensor([prompt])).logits[0, -1].double(), -1)
    p = p[: pair.vocab_size].numpy()
    counts = np.bincount(first, minlength=p.size).astype(float)
    expected = n * p
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    chi2 = stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum())
    assert chi2.pvalue > 0.001, chi2


def test_stop_strings_end_rows_at_the_completing_token(pair):
    """A task's stop string ends a row at the token that completes it (kept), one request
    at a time and batched through either adapter; the slot is refilled and later rows are
    unaffected."""
    stops = StopStrings(pair.tokenizer, ["="])  # every arith answer writes "a+b=c"
    config = _cfg("exact")
    reqs = _requests(pair, "arith", 9)
    one = one_by_one(pair, reqs, config, stops)
    for via in ADAPTERS.values():
        rows_b4 = batched.decode_batched(pair, reqs, config, 4, stops=stops, adapter=via)
        many = {r.request_id: r for r in rows_b4}
        for rid, rows in one.items():
            text = pair.tokenizer.decode(rows.request["output_ids"], skip_special_tokens=True)
            assert rows.request["stop"] == "stop" and text.count("=") == 1, text
            shorter = pair.tokenizer.decode(rows.request["output_ids"][:-1],
                                            skip_special_tokens=True)  # fmt: skip
            assert "=" not in shorter
            assert_same_up_to_near_tie(rows, many[rid], config)


def test_kv_cache_that_cannot_fit_fails_before_decoding(pair, monkeypatch):
    """The KV-size check runs before any allocation or decoding and names the sizes."""
    monkeypatch.setattr(batched, "_free_bytes", lambda device: 1_000_000)
    reqs = _requests(pair, "arith", 4)
    with pytest.raises(DecodeError, match=r"batch_size 4 × max_seq_len \d+: the KV caches need"):
        next(batched.decode_batched(pair, reqs, _cfg("exact"), 4))
    # [n_layers, B, H_kv, S_max + 1, D] for K and V, float32, target and draft
    want = sum(
        2 * m.config.num_hidden_layers * 4 * m.config.num_key_value_heads * 65
        * m.config.head_dim * 4
        for m in (pair.target, pair.draft)
    )  # fmt: skip
    assert batched.kv_bytes(pair, 4, 64) == want
    # transformers' caches hold S_max tokens per row (no scratch slot): an estimate
    assert batched.kv_bytes(pair, 4, 64, adapter=HF) == want * 64 // 65


def test_auto_batch_size():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert batched.resolve_batch_size(None, cpu, 100) == batched.AUTO_BATCH["cpu"]
    assert batched.resolve_batch_size(None, cpu, 3) == 3  # never more rows than requests
    assert batched.resolve_batch_size(32, cuda, 100) == 32


@pytest.mark.parametrize("device", ["cpu", "cuda", "mps", "auto"])
@pytest.mark.parametrize("limit", [None, 3, 100])
def test_the_planned_auto_batch_is_the_batch_that_runs(device, limit):
    """The cost table's key (costs.planned_batch_size) names the batch the engine will run."""
    from relaxspec_audit.collect.costs import planned_batch_size

    config = RunConfig(rule="greedy", device=device, limit=limit)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = batched.resolve_batch_size(None, torch.device(device), limit or 10_000)
    assert planned_batch_size(config) == runs


def test_other_causal_lms_take_the_transformers_adapter_and_the_manifest_says_so(pair, tmp_path):
    """A GPT-2 pair decodes batched over transformers' own caches, recorded in the manifest
    with the reason FastLM cannot serve it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from relaxspec_audit.collect import logs

    cfg = GPT2Config(vocab_size=pair.vocab_size, n_embd=32, n_layer=1, n_head=2, n_positions=128)
    torch.manual_seed(0)
    gpt2 = collect.make_pair(GPT2LMHeadModel(cfg).eval(), GPT2LMHeadModel(cfg).eval(),
                             pair.tokenizer)  # fmt: skip
    assert "gpt2" in adapter.choose_adapter(gpt2).reason
    config = RunConfig(rule="exact", limit=2, max_new_tokens=4, device="cpu", batch_size=8)
    run = collect.collect(config, tmp_path, pair=gpt2)
    engine = logs.read_manifest(run)["engine"]
    assert engine["engine"] == "transformers" and engine["batch_size"] == 2  # 2 requests
    assert "target: model_type 'gpt2'" in engine["reason"] and engine["kv_cache_bytes"] > 0
    fast = collect.collect(config, tmp_path / "fast", pair=pair)
    engine = logs.read_manifest(fast)["engine"]
    assert engine["engine"] == "static" and engine["batch_size"] == 2  # 2 requests only
    assert "reason" not in engine
    assert engine["kv_cache_bytes"] == batched.kv_bytes(pair, 2, engine["max_seq_len"])
    assert engine["narrowing"] is True and engine["cuda_graphs"] is False


def test_batch_size_is_a_run_option_outside_the_run_id():
    """One run whatever the batch size (THEORY §4: decisions agree up to near-ties)."""
    from relaxspec_audit import batch
    from relaxspec_audit.collect.config import ConfigError

    assert RunConfig(batch_size=4).run_id() == RunConfig().run_id()
    with pytest.raises(ConfigError, match="batch_size"):
        RunConfig(batch_size=0).validate()
    plan = batch.plan_task("arith", ["exact"], limit=2, batch_size=4)
    assert {r.batch_size for r in plan.runs} == {4}
    with pytest.raises(batch.BatchConfigError, match="batch_size"):
        batch.plan_task("arith", ["exact"], batch_size=-1)


def test_a_suspended_or_abandoned_generator_leaves_grad_mode_alone(pair):
    """Grad mode is thread state: the engine must not hold inference mode across a yield."""
    reqs = _requests(pair, "arith", 3)
    gen = batched.decode_batched(pair, reqs, _cfg("exact", max_new_tokens=4), 2)
    next(gen)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    del gen
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


@pytest.mark.parametrize("flush_rounds", [1, 3])
def test_rows_flushed_together_mid_request_log_the_same_rows(pair, monkeypatch, flush_rounds):
    """With a real vocabulary a row's log is due every few rounds; the engine then flushes
    every row together (one token_stats, one E_S grid, one host copy). Forced here on the
    small pair: the rows equal the one-request logs, flushed once per request."""
    from relaxspec_audit.collect import roundlog

    config = _cfg("nucleus", params={"theta": 0.9})
    reqs = _requests(pair, "story", 6)
    one = one_by_one(pair, reqs, config)
    calls = []
    monkeypatch.setattr(roundlog, "_FLUSH_MAX_ROUNDS", flush_rounds)
    real = roundlog.flush_together
    monkeypatch.setattr(
        batched, "flush_together", lambda logs: calls.append(len(logs)) or real(logs)
    )
    many = {r.request_id: r for r in batched.decode_batched(pair, reqs, config, 4)}
    assert calls and max(calls) > 1  # several rows' logs flushed in one call
    for rid in one:
        assert_same_up_to_near_tie(one[rid], many[rid], config)
