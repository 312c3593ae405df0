"""Loading and checking a target + draft pair (collect.pair): vocabularies, loading from disk.

Moved from test_decoder.py, which tests decoding.
"""

from __future__ import annotations

import pytest
import torch

from relaxspec_audit import collect

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_mismatched_vocab_refused(tiny_tokenizer, tmp_path):
    from conftest import build_model

    target = build_model("llama", 1, 0, vocab_size=64)
    small = build_model("llama", 1, 1, vocab_size=40)
    with pytest.raises(collect.DecodeError, match=r"target has 64 logits, draft has 40"):
        collect.make_pair(target, small, tiny_tokenizer)
    # padded embeddings beyond the tokenizer (real Qwen pairs) are fine: V = min
    padded = build_model("llama", 1, 2, vocab_size=80)
    assert collect.make_pair(target, padded, tiny_tokenizer).vocab_size == 64
    with pytest.raises(collect.DecodeError, match="80"):
        collect.make_pair(target, padded, None)
    for model, name in ((target, "t"), (small, "d")):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer.save_pretrained(tmp_path / name)
    with pytest.raises(collect.DecodeError, match="vocabulary mismatch"):
        collect.load_pair(str(tmp_path / "t"), str(tmp_path / "d"), "cpu", "float32")
    with pytest.raises(collect.DecodeError, match="no model at"):
        collect.load_pair(str(tmp_path / "nope"), str(tmp_path / "d"), "cpu", "float32")


def test_load_pair_from_disk(tiny_qwen2_pair):
    pair = collect.load_pair(
        str(tiny_qwen2_pair.target_dir), str(tiny_qwen2_pair.draft_dir), "auto", "auto"
    )
    assert pair.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pair.eos_ids == frozenset({2}) and pair.vocab_size == 64
    # the saved character tokenizer is loaded as saved (not re-mapped to Qwen2's BPE)
    assert pair.tokenizer("1 a")["input_ids"] == tiny_qwen2_pair.tokenizer("1 a")["input_ids"]
    info = pair.info
    assert info["target"]["model_type"] == "qwen2" and len(info["draft"]["config_sha256"]) == 64
