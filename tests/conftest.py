"""Shared fixtures: tiny random-weight Llama and Qwen2 target + draft pairs and a tiny
character-level tokenizer, all built in-process (no hub access), session-scoped.

Each pair shares one vocabulary. The draft is a 1-layer model whose embeddings, first
layer, norm and head are copied from the 2-layer target and perturbed, so the draft agrees
with the target often enough to exercise long accepted prefixes, full acceptance (bonus
tokens) and rejections in the same run. Weights are initialised with a large std so that
the distributions are peaked (near-uniform random logits would make every test trivial).
"""

from __future__ import annotations

import logging
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VOCAB_SIZE = 64  # model logits; the tokenizer uses fewer ids, as real padded vocabularies do
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = list(string.digits + string.ascii_lowercase + " +-*=?.,:")


@dataclass
class TinyPair:
    """A target + draft pair saved to disk, plus the in-memory models and tokenizer."""

    arch: str
    target: Any
    draft: Any
    tokenizer: Any
    target_dir: Path
    draft_dir: Path


def build_tokenizer() -> Any:
    """A character-level fast tokenizer (~50 ids): one token per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


def _config(arch: str, layers: int, vocab_size: int = VOCAB_SIZE) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.4,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def build_model(arch: str, layers: int, seed: int, vocab_size: int = VOCAB_SIZE) -> Any:
    """A random-weight causal LM of the given architecture (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch, layers, vocab_size))
    return model.eval()


def build_pair(arch: str, seed: int = 0, noise: float = 0.1) -> tuple[Any, Any]:
    """Target (2 layers) and a correlated 1-layer draft sharing embeddings/head (perturbed).

    The target's second layer writes to the residual stream at 0.3x scale, so the 1-layer
    draft agrees with it often (greedy acceptance ~15-25% per position at K = 4).
    """
    import torch

    target = build_model(arch, 2, seed)
    with torch.no_grad():
        for name, param in target.named_parameters():
            if "layers.1." in name and ("o_proj" in name or "down_proj" in name):
                param.mul_(0.3)
    draft = build_model(arch, 1, seed + 1000)
    t_state = target.state_dict()
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, tensor in draft.state_dict().items():
            src = t_state[name]  # layer 0, embeddings, norm and head exist in both
            tensor.copy_(src + noise * src.std() * torch.randn(src.shape, generator=gen))
    return target, draft


def _save(tmp: Path, arch: str, tokenizer: Any) -> TinyPair:
    target, draft = build_pair(arch)
    tdir, ddir = tmp / arch / "target", tmp / arch / "draft"
    for model, path in ((target, tdir), (draft, ddir)):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return TinyPair(arch, target, draft, tokenizer, tdir, ddir)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module, restored after it (``pytestmark`` of the module).

    Tiny models and tensors: per-op thread start-up dominates and 2 shared cores thrash;
    one thread is ~10x faster here.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    """The shared character-level tokenizer."""
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_pair(tmp_path_factory, tiny_tokenizer) -> TinyPair:
    """Tiny random Llama target + draft, saved under a session temp folder."""
    return _save(tmp_path_factory.mktemp("tiny_models"), "llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen2_pair(tmp_path_factory, tiny_tokenizer) -> TinyPair:
    """Tiny random Qwen2 target + draft, saved under a session temp folder."""
    return _save(tmp_path_factory.mktemp("tiny_models"), "qwen2", tiny_tokenizer)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_pair(request) -> TinyPair:
    """Both tiny pairs in turn (parametrised over the architecture)."""
    return request.getfixturevalue(f"tiny_{request.param}_pair")


#: The bucket of the S3-compatible test server (:func:`endpoint`).
S3_BUCKET = "relaxspec-test"


@pytest.fixture(scope="module")
def endpoint():
    """A moto S3 server on a free local port, with one bucket."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=S3_BUCKET)
    yield url
    server.stop()
