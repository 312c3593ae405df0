"""The model adapter (collect.adapter): any transformers causal LM behind FastLM's call.

``CacheLM`` keeps one transformers ``DynamicCache`` per row and crops it to the row's first
position before each call. The reference for every row is the transformers model on the
row's whole current sequence, alone and without a cache (test_fastmodel's ``_Mirror``), so
the checks cover the crop (rollback), skipped padding and idle rows, refilled and moved
rows, prefills of selected rows and kept logits, for GPT-2, OPT, a sliding-window Mistral
(its cache must record the past to roll back) and the Llama-family models FastLM also
serves. Then whole runs: GPT-2 and OPT pairs decode batched through the engine, greedy
token for token as ``generate``, sampled as one request at a time up to near-ties.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_batched import assert_same_up_to_near_tie
from test_fastmodel import (
    _Mirror,
    _ragged_batch,
    narrowed_batch,
    prefill_of_selected_rows,
    separate_prefills,
)

from relaxspec_audit import collect
from relaxspec_audit.collect import adapter, batched
from relaxspec_audit.collect.config import RunConfig
from relaxspec_audit.collect.pair import DecodeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["12+34=", "7*8=?", "abc", "z", "the sum of 5 and 9 is", "1 2 3 4"]


def _config(arch: str, layers: int):
    """A tiny random config of ``arch``: peaked distributions (a large init), EOS id 2."""
    import transformers

    ids = dict(vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gpt2":
        return transformers.GPT2Config(n_embd=32, n_layer=layers, n_head=2, n_positions=128,
                                       initializer_range=0.4, **ids)  # fmt: skip
    if arch == "opt":
        return transformers.OPTConfig(hidden_size=32, num_hidden_layers=layers, ffn_dim=64,
                                      num_attention_heads=4, max_position_embeddings=128,
                                      word_embed_proj_dim=32, init_std=0.4, **ids)  # fmt: skip
    # A window far shorter than the sequences: rolling back crosses it.
    return transformers.MistralConfig(hidden_size=32, intermediate_size=64, head_dim=8,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128,
                                      sliding_window=4, initializer_range=0.4, **ids)  # fmt: skip


def _model(arch: str, layers: int = 2, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(arch, layers)).eval()


@pytest.fixture(scope="module", params=["gpt2", "opt"])
def other_pair(request, tiny_tokenizer):
    """A 2-layer target and a 1-layer draft copied from it and perturbed (they agree often)."""
    target = _model(request.param, 2)
    draft = _model(request.param, 1, seed=1)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in target.named_parameters():  # the second layer writes little
            if ".1." in name and any(out in name for out in ("c_proj", "out_proj", "fc2")):
                param.mul_(0.3)
        source = target.state_dict()
        for name, tensor in draft.state_dict().items():
            src = source[name]  # the first layer, embeddings, norms and head exist in both
            tensor.copy_(src + 0.1 * src.std() * torch.randn(src.shape, generator=gen))
    return collect.make_pair(target, draft, tiny_tokenizer)


MODELS = ["gpt2", "opt", "mistral-window", "llama", "qwen2"]


@pytest.fixture(params=MODELS)
def any_model(request):
    name = request.param
    if name in ("llama", "qwen2"):
        return request.getfixturevalue(f"tiny_{name}_pair").target
    return _model(name.removesuffix("-window"))


def _mirror(model, **kw) -> _Mirror:
    return _Mirror(model, wrap=adapter.CacheLM, **kw)


def test_logits_match_transformers_per_row(any_model):
    _ragged_batch(_mirror(any_model, batch=3, max_seq_len=32))


def test_rows_move_prefill_alone_and_keep_their_last_logits(any_model):
    narrowed_batch(_mirror(any_model, batch=4, max_seq_len=24, seed=4))
    separate_prefills(_mirror(any_model, batch=3, max_seq_len=24, seed=1))
    prefill_of_selected_rows(_mirror(any_model, batch=3, max_seq_len=24, seed=2))


def test_padding_and_idle_rows_are_skipped_and_bad_calls_refused(tiny_llama_pair):
    """Pads and idle rows cost nothing and get zero logits; slots that are not contiguous
    positions, or a call past what a row's cache holds, are refused (a caller's bug)."""
    m = _mirror(tiny_llama_pair.target, batch=3, max_seq_len=16)
    m.step([(0, m.tokens(4)), (0, m.tokens(2)), None])
    pad = m.s_max
    out = m.fast(
        torch.tensor([[5, 6], [7, 8], [9, 9]]), torch.tensor([[pad, 4], [2, pad], [pad, pad]])
    )
    assert (out[0, 0] == 0).all() and (out[1, 1] == 0).all() and (out[2] == 0).all()
    assert (out[0, 1] != 0).any() and (out[1, 0] != 0).any()
    with pytest.raises(ValueError, match="contiguous positions"):
        m.fast(torch.tensor([[5, 6, 7]]), torch.tensor([[5, pad, 6]]))
    with pytest.raises(RuntimeError, match="holds 5 tokens but the call starts at position 9"):
        m.fast(torch.tensor([[5]]), torch.tensor([[9]]))


def test_cache_bytes_estimate_is_what_a_full_cache_holds(any_model):
    lm = adapter.CacheLM(any_model)
    assert lm.setup_cache(2, 12) == lm.cache_bytes(2, 12)
    ids = torch.randint(3, 60, (2, 12))
    lm(ids, torch.arange(12).expand(2, 12))
    held = sum(
        t.numel() * t.element_size()
        for cache in lm._caches
        for layer in cache.layers
        for t in (layer.keys, layer.values)
    )
    window = getattr(any_model.config, "sliding_window", None)
    assert held == lm.cache_bytes(2, 12) or (window and held < lm.cache_bytes(2, 12))


def test_a_cache_that_cannot_roll_back_is_refused(monkeypatch, tiny_llama_pair):
    class Frozen:
        is_croppable = False

    monkeypatch.setattr(adapter.CacheLM, "_new_cache", lambda self: Frozen())
    with pytest.raises(DecodeError, match="cannot be rolled back"):
        adapter.CacheLM(tiny_llama_pair.target)


def test_choose_adapter_names_the_model_fastlm_cannot_serve(tiny_llama_pair, tiny_tokenizer):
    llama = collect.make_pair(tiny_llama_pair.target, tiny_llama_pair.draft, tiny_tokenizer)
    assert adapter.choose_adapter(llama) == adapter.Adapter(adapter.STATIC)
    mixed = collect.make_pair(tiny_llama_pair.target, _model("gpt2", 1), tiny_tokenizer)
    chosen = adapter.choose_adapter(mixed)
    assert chosen.kind == adapter.TRANSFORMERS and chosen.reason.startswith("draft: model_type")
    alone = collect.make_pair(_model("opt"), None, tiny_tokenizer)
    assert adapter.choose_adapter(alone).reason.startswith("target: model_type 'opt'")
    with pytest.raises(ValueError, match="adapter kind"):
        adapter.Adapter("generic")


def _requests(pair) -> list[tuple[str, list[int]]]:
    return [(f"r{i}", pair.tokenizer(p)["input_ids"]) for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("rule, params", [("greedy", {}), ("asd", {"budget": 0.0}), ("target", {})])
def test_other_causal_lms_decode_batched_as_generate(other_pair, rule, params):
    """Greedy verification (and target-only) at batch 4 over six requests, so rows are
    refilled and the batch narrows, is token for token ``generate(do_sample=False)``."""
    config = RunConfig(rule=rule, params=params, k=3, max_new_tokens=16, temperature=0.0)
    reqs = _requests(other_pair)
    engine = batched.open_engine(other_pair, config, reqs, batch_size=4)
    assert engine.adapter.kind == adapter.TRANSFORMERS
    rows = {r.request_id: r for r in engine.run(reqs)}
    assert engine.widths  # the batch narrowed: rows moved with their caches
    accepted = 0
    for rid, ids in reqs:
        with torch.inference_mode():
            out = other_pair.target.generate(torch.tensor([ids]), max_new_tokens=16,
                                             do_sample=False, pad_token_id=0)  # fmt: skip
        ref = out[0, len(ids) :].tolist()
        eos = next((j for j, t in enumerate(ref) if t in other_pair.eos_ids), None)
        assert rows[rid].request["output_ids"] == (ref if eos is None else ref[: eos + 1]), rid
        accepted += sum(rows[rid].rounds["accepted"])
    assert rule == "target" or accepted > 0  # drafts were accepted: rollback was exercised


@pytest.mark.parametrize("rule, params", [("exact", {}), ("nucleus", {"theta": 0.8})])
def test_other_causal_lms_batched_equal_one_request_up_to_near_ties(other_pair, rule, params):
    """Sampled decoding of a GPT-2 or OPT pair at batch 4 logs what one request at a time
    logs, up to near-ties (the batching contract, THEORY §4). GPT-2's rows run to the
    length limit, OPT's end at an EOS after a few tokens."""
    config = RunConfig(rule=rule, params=params, k=3, max_new_tokens=16, temperature=1.0)
    reqs = _requests(other_pair)
    one = {rid: batched.decode_request(other_pair, ids, config, rid) for rid, ids in reqs}
    many = {r.request_id: r for r in batched.decode_batched(other_pair, reqs, config, 4)}
    for rid in one:
        assert_same_up_to_near_tie(one[rid], many[rid], config)


def test_engine_record_names_the_adapter_and_why(other_pair):
    config = RunConfig(rule="exact", k=3, max_new_tokens=4)
    record = batched.open_engine(other_pair, config, _requests(other_pair)).record
    assert record["engine"] == "transformers" and "model_type" in record["reason"]
    assert record["batch_size"] == len(PROMPTS) and record["kv_cache_bytes"] > 0
    pair = dataclasses.replace(other_pair, draft=None)
    target_only = RunConfig(rule="target", max_new_tokens=4, temperature=0.0)
    alone = batched.open_engine(pair, target_only, [("a", [5])])
    assert alone.draft is None
    assert alone.record["kv_cache_bytes"] == alone.target.cache_bytes(1, alone.s_max)
