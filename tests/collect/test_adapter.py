"""The model adapter (collect.adapter): any transformers causal LM behind FastLM's call.

``CacheLM`` keeps one transformers ``DynamicCache`` per row and crops it to the row's first
position before each call. The reference for every row is the transformers model on the
row's whole current sequence, alone and without a cache (test_fastmodel's ``_Mirror``), so
the checks cover the crop (rollback), skipped padding and idle rows, refilled and moved
rows, prefills of selected rows and kept logits, for GPT-2, OPT, a sliding-window Mistral
(its cache must record the past to roll back) and the Llama-family models FastLM also
serves.
"""

from __future__ import annotations

import pytest
import torch
from test_fastmodel import (
    _Mirror,
    _ragged_batch,
    narrowed_batch,
    prefill_of_selected_rows,
    separate_prefills,
)

from relaxspec_audit import collect
from relaxspec_audit.collect import adapter
from relaxspec_audit.collect.pair import DecodeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
