"""The model adapter the engine decodes through: one call, over either kind of KV cache.

The batched engine (:mod:`~relaxspec_audit.collect.batched`) talks to each model through
one call, FastLM's::

    lm(ids [B, T], input_pos [B, T], rows=None, keep=None, kv_len=None) -> logits [B, keep or T, V]

plus ``setup_cache(batch_size, max_seq_len)``, ``cache_bytes(batch_size, max_seq_len)``,
``move_rows(src, dst)``, ``scratch`` (the padding position, ``max_seq_len``) and
``pos_device`` (where the call reads ``input_pos`` and ``rows``). Token ``ids[b, t]`` sits
at position ``input_pos[b, t]`` of cache row ``b`` (or ``rows[b]``); a row's real slots are
contiguous positions ``s .. s + n - 1`` and every position below ``s`` already holds the
row's current sequence; padded slots carry the scratch position and their logits are
garbage. Rollback is implicit: a row continues from its own position.

Two adapters serve that call (:func:`choose_adapter` picks one per pair, once):

- ``static``: :class:`~relaxspec_audit.collect.fastmodel.FastLM`, a Llama-family forward
  over one preallocated ``[B, H, S_max + 1, D]`` cache per model (CUDA-graph capturable);
  used whenever ``fastmodel.supports`` accepts both models.
- ``transformers``: :class:`CacheLM`, any transformers causal LM (GPT-2, OPT, …) over
  transformers' own caches, one ``DynamicCache`` per row. Before each call a row's cache is
  cropped to the row's first position (rollback, never a recompute), then the row's real
  slots run through the model's own forward; idle and padded slots are skipped (zero
  logits). Rows run one after another: what batching buys here is the round's rule,
  logging and host copy shared by B rows, not the model's matmuls.

torch and transformers are imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from relaxspec_audit.collect.pair import Pair

#: Adapter kinds: the manifest's ``engine`` record names the one a run decoded through.
STATIC, TRANSFORMERS = "static", "transformers"


@dataclass(frozen=True)
class Adapter:
    """Which model adapter serves a pair, and why.

    Attributes:
        kind: :data:`STATIC` (FastLM over static caches) or :data:`TRANSFORMERS`
            (:class:`CacheLM` over transformers' own caches).
        reason: why the static cache cannot serve the pair (None when it can, or when the
            transformers adapter was asked for by name).
    """

    kind: str
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in (STATIC, TRANSFORMERS):
            raise ValueError(f"adapter kind: {STATIC!r} or {TRANSFORMERS!r}, got {self.kind!r}")

    def wrap(self, model: Any) -> Any:
        """The adapter over a loaded transformers model (sharing its weights; no cache yet)."""
        if self.kind == STATIC:
            from relaxspec_audit.collect.fastmodel import FastLM

            return FastLM.from_hf(model)
        return CacheLM(model)


def choose_adapter(pair: Pair) -> Adapter:
    """The one choice of model adapter: FastLM when it serves both models, else CacheLM.

    The reason FastLM cannot serve a model (``fastmodel.supports``) names the model's role;
    it is recorded in the run manifest's ``engine`` record.
    """
    from relaxspec_audit.collect.fastmodel import supports

    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is not None and (reason := supports(model)) is not None:
            return Adapter(TRANSFORMERS, f"{role}: {reason}")
    return Adapter(STATIC)


@functools.cache
def _cache_kwarg(model_cls: type) -> str:
    # transformers >= 5.2x names the argument `cache` and deprecates `past_key_values`.
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class CacheLM:
    """Any transformers causal LM behind FastLM's call, one ``DynamicCache`` per row.

    Positions are read on the host (``pos_device`` is the CPU): a transformers cache is
    cropped by host integers, and the engine builds its positions there anyway, so the
    call costs no device sync. ``kv_len`` is accepted and ignored: after the crop a row's
    cache holds exactly its context.

    Args:
        model: a loaded transformers ``*ForCausalLM`` (eval mode).
    """

    def __init__(self, model: Any) -> None:
        import torch

        from relaxspec_audit.collect.pair import logit_size

        self.model = model
        self.vocab = logit_size(model)
        self.dtype = next(model.parameters()).dtype
        self.pos_device = torch.device("cpu")
        self._kwarg = _cache_kwarg(type(model))
        self._caches: list[Any] = []
        self._scratch: int | None = None
        if not getattr(self._new_cache(), "is_croppable", True):
            from relaxspec_audit.collect.pair import DecodeError

            name = type(model).__name__
            raise DecodeError(f"{name}: its transformers cache cannot be rolled back (crop), "
                              "which every speculative round needs")  # fmt: skip

    @property
    def scratch(self) -> int:
        """The padding position ``S_max`` (slots at it are skipped)."""
        if self._scratch is None:
            raise RuntimeError("call setup_cache first")
        return self._scratch

    def cache_bytes(self, batch_size: int, max_seq_len: int) -> int | None:
        """An estimate of K and V at ``max_seq_len`` tokens per row (None: unknown shapes).

        ``2 · layers · B · kv_heads · S · head_dim`` items of the model's dtype, from the
        config's standard names; transformers grows a cache by concatenation, so a call
        briefly holds a layer's old and new tensors on top.
        """
        cfg = self.model.config.get_text_config()
        try:
            heads = cfg.num_attention_heads
            kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
            layers = cfg.num_hidden_layers
        except (AttributeError, TypeError):
            return None
        itemsize = self.dtype.itemsize
        return 2 * layers * batch_size * kv_heads * max_seq_len * head_dim * itemsize

    def setup_cache(self, batch_size: int, max_seq_len: int) -> int | None:
        """One empty cache per row (nothing preallocated); returns :meth:`cache_bytes`."""
        self._caches = [self._new_cache() for _ in range(batch_size)]
        self._scratch = max_seq_len
        return self.cache_bytes(batch_size, max_seq_len)

    def move_rows(self, src: list[int], dst: list[int]) -> None:
        """Rows ``src`` take rows ``dst``'s places (their caches move; ``src`` start empty)."""
        for s, d in zip(src, dst, strict=True):
            self._caches[d], self._caches[s] = self._caches[s], self._new_cache()

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        # Layers that keep a bounded past (sliding windows) must record it to roll back.
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        return cache

    def __call__(
        self,
        ids: torch.Tensor,
        input_pos: torch.Tensor,
        rows: torch.Tensor | None = None,
        keep: int | None = None,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Logits of ``ids`` at per-row positions (FastLM's call; padded slots are zeros).

        Args:
            ids: ``[b, T]`` token ids on the model's device.
            input_pos: ``[b, T]`` positions (on the CPU, :attr:`pos_device`); the scratch
                position in padded slots.
            rows: ``[b]`` cache rows the ids are for (None: rows ``0 .. b-1``).
            keep: logits for the last ``keep`` slots only (None: all ``T``).
            kv_len: ignored (see the class docstring).

        Returns:
            ``[b, keep or T, V]`` logits in the dtype the model returns them in.

        Raises:
            ValueError: a row's real slots are not contiguous positions.
            RuntimeError: a row's cache holds fewer tokens than its first position.
        """
        import torch

        b, t = ids.shape
        n_out = t if keep is None else keep
        which = range(b) if rows is None else rows.tolist()
        out = None  # [b, n_out, V], in the dtype the model's logits come in
        with torch.no_grad():
            for j, (row, pos) in enumerate(zip(which, input_pos.tolist(), strict=True)):
                real = [i for i, p in enumerate(pos) if p != self.scratch]
                if not real:
                    continue  # an idle row
                lo, hi = real[0], real[-1] + 1
                start = pos[lo]
                if pos[lo:hi] != list(range(start, start + hi - lo)):
                    raise ValueError(f"row {row}: real slots must hold contiguous positions, "
                                     f"got {pos}")  # fmt: skip
                cache = self._at(row, start)
                # Real slots among the kept ones: a suffix of the row's real run.
                first = max(lo, t - n_out)
                n = hi - first
                logits = self._forward(ids[j : j + 1, lo:hi], cache, max(n, 1))  # [1, n, V]
                if out is None:
                    out = logits.new_zeros(b, n_out, logits.shape[-1])
                if n > 0:
                    out[j, first - (t - n_out) : hi - (t - n_out)] = logits[0, -n:]
        if out is None:  # every row idle
            out = torch.zeros(b, n_out, self.vocab, dtype=self.dtype, device=ids.device)
        return out

    def _at(self, row: int, start: int) -> Any:
        """Row ``row``'s cache rolled back to its first ``start`` tokens."""
        if start == 0:  # a new request in this row
            self._caches[row] = self._new_cache()
            return self._caches[row]
        cache = self._caches[row]
        held = cache.get_seq_length()
        if held < start:
            raise RuntimeError(f"row {row}: its cache holds {held} tokens but the call starts "
                               f"at position {start}")  # fmt: skip
        if held > start:
            # transformers 5 takes a negative count; older versions read a negative
            # max_length the same way, so one call covers both.
            cache.crop(start - held)
        return cache

    def _forward(self, ids: torch.Tensor, cache: Any, keep: int) -> torch.Tensor:
        kwargs = {self._kwarg: cache}
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=keep, **kwargs).logits
