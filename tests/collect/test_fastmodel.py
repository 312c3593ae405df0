"""FastLM (collect.fastmodel): per-row-position logits equal transformers', row by row.

The reference for every row is the transformers model run on that row's whole current
sequence, alone and unpadded (``model(ids).logits``), so the checks cover the cache
writes, the per-row masks, RoPE at per-row positions, padding to the scratch slot, ragged
verification, rollback (stale K/V never leaks) and refilling a row with a new request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import build_model

from relaxspec_audit.collect.fastmodel import FastLM, supports

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARITH = Path(__file__).resolve().parents[2] / "data" / "models" / "arith"
ATOL = 1e-4  # float32; observed differences are ~1e-5 (reduction order only)


@pytest.fixture(scope="module")
def arith_pair():
    from transformers import AutoModelForCausalLM

    load = AutoModelForCausalLM.from_pretrained
    return tuple(load(ARITH / name, dtype=torch.float32).eval() for name in ("target", "draft"))


def _tiny_mistral():
    from transformers import AutoModelForCausalLM, MistralConfig

    torch.manual_seed(3)
    config = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,  # != hidden / heads, to exercise an explicit head_dim
        max_position_embeddings=512,
        sliding_window=None,
        initializer_range=0.4,
    )
    return AutoModelForCausalLM.from_config(config).eval()


MODELS = [
    "llama-target",
    "llama-draft",
    "qwen2-target",
    "qwen2-draft",
    "arith-target",
    "arith-draft",
    "mistral",
]


@pytest.fixture(params=MODELS)
def hf_model(request):
    name = request.param
    if name == "mistral":
        return _tiny_mistral()
    arch, role = name.split("-")
    if arch == "arith":
        return request.getfixturevalue("arith_pair")[role == "draft"]
    return getattr(request.getfixturevalue(f"tiny_{arch}_pair"), role)


class _Mirror:
    """A model adapter under test and the sequence each of its rows should now hold."""

    def __init__(
        self,
        model,
        batch: int,
        max_seq_len: int,
        seed: int = 0,
        rel: float | None = None,
        windowed: bool = False,
        wrap=FastLM.from_hf,
    ) -> None:
        """``rel``: compare with a tolerance of ``rel`` × the reference's largest logit
        (low precision) instead of :data:`ATOL`. ``windowed``: every call attends only the
        tightest window its positions allow (``kv_len`` = its furthest position + 1).
        ``wrap``: the adapter over the model (FastLM; ``adapter.CacheLM`` in test_adapter)."""
        self.model, self.s_max, self.rel, self.windowed = model, max_seq_len, rel, windowed
        self.device = next(model.parameters()).device
        self.fast = wrap(model)
        self.fast.setup_cache(batch, max_seq_len)
        self.seqs: list[list[int]] = [[] for _ in range(batch)]
        self.gen = torch.Generator().manual_seed(seed)
        self.high = min(model.config.vocab_size, 60)

    def tokens(self, n: int, avoid: Sequence[int] = ()) -> list[int]:
        """n random ids; the i-th differs from avoid[i] (a rollback must change tokens)."""
        toks = torch.randint(3, self.high, (n,), generator=self.gen).tolist()
        return [
            t if i >= len(avoid) or t != avoid[i] else 3 + (t - 2) % (self.high - 3)
            for i, t in enumerate(toks)
        ]

    def step(self, feeds: list[tuple[int, list[int]] | None]) -> None:
        """One padded call: row b gets ``feeds[b] = (start, tokens)`` or idles (None)."""
        t = max(len(f[1]) for f in feeds if f is not None)
        ids = torch.zeros(len(feeds), t, dtype=torch.long)  # [B, T], pad id 0
        pos = torch.full((len(feeds), t), self.s_max, dtype=torch.long)  # [B, T], scratch
        for row, feed in enumerate(feeds):
            if feed is not None:
                start, toks = feed
                ids[row, : len(toks)] = torch.tensor(toks)
                pos[row, : len(toks)] = torch.arange(start, start + len(toks))
        kv_len = int(pos[pos < self.s_max].max()) + 1 if self.windowed else None
        out = self.fast(ids.to(self.device), pos.to(self.fast.pos_device), kv_len=kv_len)
        assert out.shape == (len(feeds), t, self.model.config.vocab_size)
        assert out.dtype == self.model.dtype
        assert torch.isfinite(out).all()  # pads' queries are never fully masked
        for row, feed in enumerate(feeds):
            if feed is None:
                continue
            start, toks = feed
            assert start <= len(self.seqs[row])  # contiguous: positions < start are current
            self.seqs[row] = self.seqs[row][:start] + toks
            with torch.no_grad():
                ref = self.model(torch.tensor([self.seqs[row]], device=self.device)).logits[0]
            got, want = out[row, : len(toks)].float(), ref[start : start + len(toks)].float()
            atol = ATOL if self.rel is None else self.rel * want.abs().max().item()
            torch.testing.assert_close(got, want, atol=atol, rtol=0)

    def at_end(self, row: int, n: int) -> tuple[int, list[int]]:
        return len(self.seqs[row]), self.tokens(n)


def test_logits_match_transformers_per_row(hf_model):
    _ragged_batch(_Mirror(hf_model, batch=3, max_seq_len=32))


def test_logits_match_transformers_in_the_tightest_attention_window(hf_model):
    """``kv_len`` = the call's furthest position + 1: the same logits, though stale K/V of
    rolled-back and refilled rows lie beyond the window or inside it, masked."""
    _ragged_batch(_Mirror(hf_model, batch=3, max_seq_len=32, windowed=True))


def test_an_attention_window_cuts_what_lies_beyond_it(tiny_llama_pair):
    m = _Mirror(tiny_llama_pair.target, batch=1, max_seq_len=24, seed=5)
    m.step([(0, m.tokens(10))])
    ids, pos = torch.tensor([m.tokens(1)]), torch.tensor([[10]])
    whole = m.fast(ids, pos)  # [1, 1, V]
    torch.testing.assert_close(m.fast(ids, pos, kv_len=11), whole, atol=ATOL, rtol=0)
    # A window short of the query's position drops keys it should see: other logits. (The
    # engine never does this; the check shows that kv_len really bounds the attention.)
    assert (m.fast(ids, pos, kv_len=4) - whole).abs().max() > 100 * ATOL
    for bad in (0, 25):
        with pytest.raises(ValueError, match=f"kv_len {bad} is not in 1 .. 24"):
            m.fast(ids, pos, kv_len=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run benchmarks/gpu.sh)")
@pytest.mark.parametrize(("dtype", "rel"), [(torch.float32, None), (torch.bfloat16, 0.05)])
def test_cuda_logits_match_transformers_per_row(tiny_llama_pair, dtype, rel):
    """The same ragged batch on CUDA, through the grouped-query attention path (4 heads,
    2 K/V heads: ``enable_gqa``) that the GPU benchmarks' model takes; bf16 against
    transformers' bf16 within 5 % of the largest logit (a wrong position, mask or cache
    row is off by the logits' whole scale)."""
    import copy

    model = copy.deepcopy(tiny_llama_pair.target).to("cuda", dtype)
    _ragged_batch(_Mirror(model, batch=3, max_seq_len=32, rel=rel))


def _ragged_batch(m: _Mirror) -> None:
    """Prefill, decode, verify, ragged rollback, a refilled row and an idle one."""
    # Prefill: one padded call, three prompt lengths (the short rows pad to the scratch slot).
    m.step([(0, m.tokens(n)) for n in (7, 3, 5)])
    for _ in range(3):  # decode, T = 1, every row at its own position
        m.step([m.at_end(row, 1) for row in range(3)])
    m.step([m.at_end(row, 5) for row in range(3)])  # verify K + 1 = 5 in one call
    # Ragged acceptance: row 0 continues 2 positions earlier with different tokens, row 1
    # accepted 1 of 4 drafts (start 4 back), row 2 accepted all.
    back0 = len(m.seqs[0]) - 2
    m.step(
        [
            (back0, m.tokens(5, avoid=m.seqs[0][back0:])),
            (len(m.seqs[1]) - 4, m.tokens(5, avoid=m.seqs[1][-4:])),
            m.at_end(2, 5),
        ]
    )
    # Row 1 gets a new, shorter request (positions restart at 0) while the others decode;
    # its old request's K/V at positions >= 2 are stale and must stay invisible.
    assert len(m.seqs[1]) > 8
    m.step([m.at_end(0, 1), (0, m.tokens(2)), m.at_end(2, 1)])
    m.step([m.at_end(0, 1), m.at_end(1, 5), None])  # row 2 idles: all pads
    for _ in range(2):
        m.step([m.at_end(row, 1) for row in range(3)])


def test_moved_rows_decode_on_in_a_narrowed_batch(tiny_llama_pair):
    """``move_rows`` carries a row's K/V (every layer) to another cache row, and a call with
    fewer rows than the cache (no ``rows=``) is for rows 0 .. b-1: what the batched engine
    does when it narrows a draining batch."""
    narrowed_batch(_Mirror(tiny_llama_pair.target, batch=4, max_seq_len=24, seed=4))


def narrowed_batch(m: _Mirror) -> None:
    """Four rows decode, two finish, the other two move into their rows and decode on."""
    m.step([m.at_end(row, n) for row, n in zip(range(4), (5, 3, 6, 4), strict=True)])
    m.step([m.at_end(row, 2) for row in range(4)])
    m.fast.move_rows([3, 2], [0, 1])  # rows 0 and 1 finished; 3 and 2 move into them
    m.seqs[0], m.seqs[1] = m.seqs[3], m.seqs[2]
    m.seqs = m.seqs[:2]
    m.step([m.at_end(0, 1), m.at_end(1, 3)])  # a [2, T] call over a 4-row cache
    m.step([(len(m.seqs[0]) - 2, m.tokens(3, avoid=m.seqs[0][-2:])), m.at_end(1, 1)])


def test_separate_prefills_and_mixed_lengths(tiny_qwen2_pair):
    separate_prefills(_Mirror(tiny_qwen2_pair.target, batch=3, max_seq_len=24, seed=1))


def separate_prefills(m: _Mirror) -> None:
    """Rows prefilled one at a time (the others idle), then mixed lengths and a rollback."""
    for row, n in enumerate((4, 9, 1)):  # one row at a time; the others idle
        m.step([(0, m.tokens(n)) if r == row else None for r in range(3)])
    m.step([m.at_end(0, 5), m.at_end(1, 1), m.at_end(2, 3)])
    m.step([(len(m.seqs[0]) - 5, m.tokens(5, avoid=m.seqs[0][-5:])), None, m.at_end(2, 5)])


def test_prefill_of_selected_rows_and_kept_logits(tiny_llama_pair):
    """``rows=`` prefills a new request in some rows only; ``keep=`` trims the logits."""
    prefill_of_selected_rows(_Mirror(tiny_llama_pair.target, batch=3, max_seq_len=24, seed=2))


def prefill_of_selected_rows(m: _Mirror) -> None:
    """A new 7-token request prefilled in row 1 alone, its last logits kept; all decode on."""
    m.step([m.at_end(row, n) for row, n in zip(range(3), (4, 6, 2), strict=True)])
    prompt = m.tokens(7)
    rows = torch.tensor([1], device=m.fast.pos_device)
    pos = torch.arange(7, device=m.fast.pos_device)[None]
    out = m.fast(torch.tensor([prompt], device=m.device), pos, rows=rows, keep=1)  # [1, 1, V]
    m.seqs[1] = prompt
    with torch.no_grad():
        ref = m.model(torch.tensor([prompt], device=m.device)).logits[0, -1]  # [V]
    torch.testing.assert_close(out[0, 0], ref, atol=ATOL, rtol=0)
    # Row 1 continues from its new prompt; rows 0 and 2 were untouched by the prefill.
    m.step([m.at_end(row, 1) for row in range(3)])


def test_shares_parameters(tiny_llama_pair, arith_pair):
    for model in (tiny_llama_pair.target, arith_pair[0]):  # untied and tied embeddings
        fast = FastLM.from_hf(model)
        assert {id(p) for p in fast.parameters()} == {id(p) for p in model.parameters()}


def test_cache_bytes_is_what_setup_allocates(tiny_llama_pair, arith_pair):
    for model in (tiny_llama_pair.target, arith_pair[0]):
        fast = FastLM.from_hf(model)
        fast.cache_bytes(4, 64)
        assert fast.k_cache is None  # computed, not allocated
        for b, s in ((1, 8), (3, 17)):
            predicted = fast.cache_bytes(b, s)
            assert fast.setup_cache(b, s) == predicted
            c = model.config
            shape = (c.num_hidden_layers, b, c.num_key_value_heads, s + 1, fast.head_dim)
            assert fast.k_cache.shape == fast.v_cache.shape == shape
            allocated = sum(t.numel() * t.element_size() for t in (fast.k_cache, fast.v_cache))
            assert allocated == predicted
            assert fast.scratch == s


def test_bfloat16_logits_stay_in_model_dtype():
    model = build_model("llama", 2, seed=5).to(torch.bfloat16)
    fast = FastLM.from_hf(model)
    fast.setup_cache(2, 8)
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    out = fast(ids, torch.tensor([[0, 1, 2], [0, 1, 8]]))  # [2, 3, V]
    assert out.dtype == torch.bfloat16
    with torch.no_grad():
        ref = model(ids[:1]).logits[0]
    assert (out[0].float() - ref.float()).abs().max() < 0.1 * ref.float().abs().max()


def _cfg_model(cls_name: str, **kw):
    import transformers
    from transformers import AutoModelForCausalLM

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    base.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = getattr(transformers, cls_name)(**{**base, **kw})
    return AutoModelForCausalLM.from_config(config)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    )


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (_gpt2, "model_type 'gpt2'"),
        (
            lambda: _cfg_model(
                "LlamaConfig",
                rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
            ),
            "rope_type 'linear'",
        ),
        (lambda: _cfg_model("LlamaConfig", hidden_act="gelu"), "hidden_act 'gelu'"),
        (lambda: _cfg_model("MistralConfig", sliding_window=16), "sliding window 16"),
        (
            lambda: _cfg_model(
                "Qwen2Config", use_sliding_window=True, sliding_window=16, max_window_layers=0
            ),
            "sliding window 16",
        ),
    ],
    ids=["gpt2", "llama-linear-rope", "gelu", "mistral-window", "qwen2-window"],
)
def test_supports_gives_a_reason(build, reason):
    model = build()
    got = supports(model)
    assert got is not None and reason in got
    with pytest.raises(ValueError, match="cannot serve"):
        FastLM.from_hf(model)


def test_supports_windows_that_never_cut():
    # Mistral's default window (4096) over a 64-position model, and Qwen2's unused window.
    assert supports(_cfg_model("MistralConfig", sliding_window=64)) is None
    assert supports(_cfg_model("Qwen2Config", use_sliding_window=False)) is None


def test_forward_does_not_sync_with_host(tiny_qwen2_pair):
    """No `.item()`/`bool(t)`/data-dependent shapes in forward (CUDA-graph capturable)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    forbidden = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "item"}

    class NoSync(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in forbidden:
                raise AssertionError(f"host sync inside forward: aten.{name}")
            return func(*args, **(kwargs or {}))

    fast = FastLM.from_hf(tiny_qwen2_pair.target)
    fast.setup_cache(2, 8)
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    pos = torch.tensor([[0, 1, 2], [4, 5, 8]])
    with NoSync():
        fast(ids, pos)
    with pytest.raises(AssertionError, match="host sync"), NoSync():
        torch.ones(2).sum().item()
