"""A Llama-family forward pass over a preallocated KV cache with per-row positions.

The batched speculative decoder runs ``B`` requests in lock-step, but every row accepts a
different number of drafts (ragged acceptance), so every row sits at its own position.
:class:`FastLM` serves that: ``forward(ids [B, T], input_pos [B, T])`` places token
``ids[b, t]`` at position ``input_pos[b, t]`` of row ``b``, writes its K/V there, and lets
it attend to the row's cache positions ``<= input_pos[b, t]``. It shares (never copies)
the parameters of an already-loaded transformers Llama, Qwen2 or Mistral model
(:func:`supports` says whether one can be served; otherwise the engine decodes through
transformers' own caches, ``collect.adapter.CacheLM``, and records why).

After gpt-fast's ``model.py`` (pytorch-labs/gpt-fast): a static ``[B, H_kv, S_max, D]``
cache written in place, the mask derived from the positions tensor, shapes that never
change, so a decode step can later be captured as a CUDA graph. Our twist: ``input_pos`` is
``[B, T]``, not ``[T]``, so the write is a ``scatter_`` along the sequence dimension and the
mask is ``key_pos <= input_pos[b, t]`` per row rather than a slice of one causal mask.
RoPE follows transformers (``rotate_half`` over two halves, cos/sin computed in float32 and
cast to the model's dtype), not gpt-fast's interleaved pairs, because the weights are HF's.

Padding. A row with fewer than ``T`` tokens in a call pads its slots with any token id at
position ``S_max`` (the scratch position). The cache has ``S_max + 1`` slots; pads write
their K/V to the scratch slot ``S_max``, which no query ever attends (the mask covers only
``0 .. S_max - 1``). A pad's own query attends to the whole window (its logits are garbage,
to be ignored) so that no query row is fully masked (which would give NaN).

The attention window. A call may attend only the first ``kv_len`` slots, when the caller
knows (on the host) that every real position of the call is below it. Keys past a
query's position are masked anyway, so the logits are the same up to the float rounding
of a shorter reduction; what changes is the cost: attention reads the rows' context
rather than the whole cache, which is sized for the longest prompt plus ``max_new_tokens``.

Rollback is implicit (the invariant). For every row, a call's real slots are contiguous
positions ``s .. s + n - 1`` and every position ``< s`` holds the K/V of the row's current
sequence. Then each query at ``p`` attends to positions ``0 .. p``: those ``< s`` are
current by the invariant, those in ``s .. p`` were written by this very call (all ``T``
slots are written before anyone attends, layer by layer), and positions ``> p`` (stale K/V
of tokens that were rejected, or of the row's previous request) are masked. So a row that
accepts fewer tokens just continues from its shorter position, and its stale entries are
overwritten before any query at those positions could see them; a new request in a row
(continuous batching) starts again at position 0. Nothing is ever cleared or cropped.

No host syncs in ``forward`` (no ``.item()``, no Python branch on tensor values) and fixed
shapes for a fixed ``(B, T, kv_len)``. Inference only: ``forward`` runs under ``torch.no_grad``
(the cache is written in place and must not keep an autograd graph between calls).

Unlike the rest of the package this module imports torch at the top (it defines a
``torch.nn.Module``); only the model adapter (``collect.adapter``) imports it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")
# `enable_gqa` of scaled_dot_product_attention arrived in torch 2.5 (pyproject allows 2.4).
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def _rope(config: Any) -> tuple[str, Any]:
    """(rope_type, rope_theta) of a transformers config, old (<5) or new spelling."""
    params = getattr(config, "rope_parameters", None)
    if params is None:  # transformers < 5: rope_theta attribute, rope_scaling dict or None
        scaling = getattr(config, "rope_scaling", None) or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        return kind, getattr(config, "rope_theta", None)
    kind = params.get("rope_type", "default")
    return kind, params.get("rope_theta", getattr(config, "rope_theta", None))


def _sliding_window(config: Any) -> int | None:
    """The attention window in effect, or None when every layer attends to the whole row."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    # A window at least as long as any sequence the model takes never cuts anything.
    return None if window >= config.max_position_embeddings else window


def supports(model: Any) -> str | None:
    """Whether :class:`FastLM` can serve a loaded transformers causal LM.

    Args:
        model: a transformers ``*ForCausalLM``.

    Returns:
        None if it can; otherwise a short reason (why not), recorded when the engine
        decodes through transformers' own caches instead (``collect.adapter``).
    """
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model_type {kind!r} is not one of {', '.join(SUPPORTED_TYPES)}"
    rope_type, theta = _rope(config)
    if rope_type != "default":
        return f"rope_type {rope_type!r} (only 'default' RoPE)"
    if theta is None:
        return "no rope_theta in the config"
    window = _sliding_window(config)
    if window is not None:
        return f"sliding window {window} in effect (< max_position_embeddings)"
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"hidden_act {act!r} (only 'silu')"
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        return "partial rotary embedding"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return f"unexpected module layout ({type(model).__name__})"
    return None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As transformers' LlamaRMSNorm: the statistics in float32, the product in x's dtype.
    h = x.float()  # [B, T, E]
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)  # [B, T, E]
    return weight * h.to(x.dtype)  # [B, T, E]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # transformers' rotate_half convention: the two halves of D are the (re, im) pairs.
    x1, x2 = x.chunk(2, dim=-1)  # [B, H, T, D/2] each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin  # [B, H, T, D]


class _Block(nn.Module):
    """One decoder layer, built from (and sharing) a transformers decoder layer's modules."""

    def __init__(self, layer: Any, fast: FastLM) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        # The HF Linear modules themselves: same parameters, and their biases (Qwen2's q/k/v,
        # Llama's optional attention_bias / mlp_bias) come for free.
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
        )
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.attn_norm = layer.input_layernorm.weight  # [E], shared Parameter
        self.mlp_norm = layer.post_attention_layernorm.weight  # [E], shared Parameter
        self.n_heads, self.n_kv, self.head_dim, self.eps = (
            fast.n_heads,
            fast.n_kv_heads,
            fast.head_dim,
            fast.eps,
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        write_idx: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        n_keys = mask.shape[-1]
        b, t, _ = x.shape
        h = _rms_norm(x, self.attn_norm, self.eps)  # [B, T, E]
        q = self.q_proj(h).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = self.v_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)  # [B, H, T, D], [B, Hkv, T, D]
        # Write all T slots before attending, so a verify call attends within itself
        # causally; pads all land in the scratch slot S_max (duplicates: any one wins).
        k_cache.scatter_(2, write_idx, k)  # [B, Hkv, S_max + 1, D]
        v_cache.scatter_(2, write_idx, v)  # [B, Hkv, S_max + 1, D]
        keys, values = k_cache[:, :, :n_keys], v_cache[:, :, :n_keys]  # [B, Hkv, S_kv, D]
        if self.n_heads != self.n_kv and not _SDPA_GQA:  # config constant, not tensor data
            rep = self.n_heads // self.n_kv
            keys = keys.repeat_interleave(rep, dim=1)  # [B, H, S_kv, D]
            values = values.repeat_interleave(rep, dim=1)  # [B, H, S_kv, D]
        gqa = {"enable_gqa": True} if self.n_heads != self.n_kv and _SDPA_GQA else {}
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, **gqa)  # [B,H,T,D]
        y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # [B, T, H*D]
        x = x + self.o_proj(y)  # [B, T, E]
        h = _rms_norm(x, self.mlp_norm, self.eps)  # [B, T, E]
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))  # [B, T, E]


class FastLM(nn.Module):
    """A Llama-family causal LM over a static KV cache, every row at its own positions.

    Build with :meth:`from_hf`, allocate with :meth:`setup_cache`, then call
    ``forward(ids, input_pos)``. Real positions are ``0 .. max_seq_len - 1``; the position
    ``max_seq_len`` (:attr:`scratch`) marks padding (see the module docstring).
    """

    k_cache: torch.Tensor | None
    v_cache: torch.Tensor | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None

    def __init__(self, model: Any) -> None:
        super().__init__()
        config = model.config
        self.n_layers = config.num_hidden_layers
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.eps = config.rms_norm_eps
        self.rope_theta = float(_rope(config)[1])
        self.embed = model.model.embed_tokens.weight  # [V, E], shared Parameter
        self.blocks = nn.ModuleList(_Block(layer, self) for layer in model.model.layers)
        self.norm = model.model.norm.weight  # [E], shared Parameter
        self.lm_head = model.lm_head  # tied to `embed` by transformers when tie_word_embeddings
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)

    @classmethod
    def from_hf(cls, model: Any) -> FastLM:
        """Wrap a loaded transformers model, sharing its parameters (same device and dtype).

        Raises:
            ValueError: when :func:`supports` gives a reason.
        """
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"FastLM cannot serve this model: {reason}")
        return cls(model)

    @property
    def pos_device(self) -> torch.device:
        """Where calls read ``input_pos`` and ``rows``: the weights' device (no host sync)."""
        return self.embed.device

    @property
    def scratch(self) -> int:
        """The padding position ``S_max`` (a slot that pads write and nothing attends)."""
        if self.k_cache is None:
            raise RuntimeError("call setup_cache first")
        return self.k_cache.shape[3] - 1

    def cache_bytes(self, batch_size: int, max_seq_len: int) -> int:
        """Bytes that :meth:`setup_cache` would allocate for K and V (nothing allocated)."""
        itemsize = self.embed.element_size()
        slots = self.n_layers * batch_size * self.n_kv_heads * (max_seq_len + 1) * self.head_dim
        return 2 * slots * itemsize

    def setup_cache(self, batch_size: int, max_seq_len: int) -> int:
        """Preallocate K/V ``[n_layers, B, H_kv, S_max + 1, D]`` (and the RoPE tables).

        Replaces any previous cache. Returns the bytes of K and V (:meth:`cache_bytes`).
        """
        w = self.embed
        shape = (self.n_layers, batch_size, self.n_kv_heads, max_seq_len + 1, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)  # [L, B, Hkv, S+1, D]
        self.v_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)  # [L, B, Hkv, S+1, D]
        # RoPE tables for positions 0..S_max as transformers computes them (float32, then
        # cast), so a lookup by input_pos gives bit-identical cos/sin.
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=w.device)  # [D/2]
        inv_freq = 1.0 / (self.rope_theta ** (half / self.head_dim))  # [D/2]
        pos = torch.arange(max_seq_len + 1, dtype=torch.float32, device=w.device)  # [S+1]
        freqs = pos[:, None] * inv_freq[None, :]  # [S+1, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S+1, D]
        self.cos, self.sin = emb.cos().to(w.dtype), emb.sin().to(w.dtype)  # [S+1, D] each
        return self.cache_bytes(batch_size, max_seq_len)

    def move_rows(self, src: list[int], dst: list[int]) -> None:
        """Copy the K/V of cache rows ``src`` into rows ``dst`` (every layer, every slot)."""
        if self.k_cache is None:
            raise RuntimeError("call setup_cache first")
        s = torch.tensor(src, dtype=torch.long, device=self.k_cache.device)  # [n]
        d = torch.tensor(dst, dtype=torch.long, device=self.k_cache.device)  # [n]
        for cache in (self.k_cache, self.v_cache):  # [L, B, Hkv, S_max + 1, D]
            for layer in cache:  # one layer's rows at a time: a small temporary
                layer.index_copy_(0, d, layer.index_select(0, s))

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        input_pos: torch.Tensor,
        rows: torch.Tensor | None = None,
        keep: int | None = None,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Logits of ``ids`` at per-row positions, writing their K/V into the cache.

        Args:
            ids: ``[B, T]`` token ids (any valid id in padded slots); ``[b, T]`` with
                ``b < B`` and no ``rows`` is for cache rows ``0 .. b-1`` (a batch narrowed
                after its last request, :meth:`move_rows`).
            input_pos: ``[B, T]`` positions, contiguous per row for the real slots; the
                scratch position ``S_max`` in padded slots.
            rows: ``[b]`` cache rows that ``ids`` are for (None: rows ``0 .. b-1``).
                Prefilling a new request in one row costs that row alone, not ``B`` rows.
            keep: only the last ``keep`` positions get logits (None: all ``T``); a
                prefill needs none or one, and ``[T, V]`` logits of a long prompt are large.
            kv_len: attend only cache slots ``0 .. kv_len - 1`` (None: all ``S_max``). The
                caller guarantees every real position of the call is below it (a host
                number: checking it here would read ``input_pos`` back, a sync). Attention
                then costs the rows' context, not the cache's capacity: a static cache is
                sized for the longest prompt plus ``max_new_tokens``, and most rows sit
                far below that.

        Returns:
            ``[B, keep or T, V]`` logits in the model's dtype (padded slots: garbage).
        """
        if self.k_cache is None:
            raise RuntimeError("call setup_cache first")
        b, t = ids.shape
        _, _, n_kv, slots, d = self.k_cache.shape
        x = F.embedding(ids, self.embed)  # [B, T, E]
        cos = self.cos[input_pos][:, None]  # [B, 1, T, D], broadcast over heads
        sin = self.sin[input_pos][:, None]  # [B, 1, T, D]
        write_idx = input_pos[:, None, :, None].expand(b, n_kv, t, d)  # [B, Hkv, T, D]
        n_keys = slots - 1 if kv_len is None else kv_len
        if not 0 < n_keys < slots:
            raise ValueError(f"kv_len {kv_len} is not in 1 .. {slots - 1} (the cache's S_max)")
        key_pos = torch.arange(n_keys, device=ids.device)  # [S_kv], never the scratch slot
        mask = key_pos[None, None, None, :] <= input_pos[:, None, :, None]  # [B, 1, T, S_kv]
        for i, block in enumerate(self.blocks):
            if rows is None:  # rows 0 .. b-1: a view, so a narrowed batch writes in place
                x = block(x, cos, sin, self.k_cache[i][:b], self.v_cache[i][:b], write_idx, mask)
            else:  # a copy of the rows' cache, written back after the layer
                kc, vc = self.k_cache[i][rows], self.v_cache[i][rows]  # [b, Hkv, S+1, D]
                x = block(x, cos, sin, kc, vc, write_idx, mask)  # [b, T, E]
                self.k_cache[i].index_copy_(0, rows, kc)
                self.v_cache[i].index_copy_(0, rows, vc)
        if keep is not None:
            x = x[:, t - keep :]  # [B, keep, E]
        x = _rms_norm(x, self.norm, self.eps)  # [B, keep or T, E]
        return self.lm_head(x)  # [B, keep or T, V]
