"""Forward passes with a transformers KV cache: a new cache, prefill, cached forward, rollback.

The decode engine keeps one ``DynamicCache`` per model and request and never recomputes a
prefix: after each round both caches are cropped back to the emitted sequence (THEORY §1;
the invariant is stated in ``collect.engine``). These helpers hide the differences between
transformers versions (the cache constructor, the cache argument's name, ``crop``'s sign).

transformers is imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers without the config argument
        return DynamicCache()


def _crop(cache: Any, length: int) -> None:
    """Roll a cache back to its first ``length`` tokens (no recompute)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        # transformers 5 takes a negative count; older versions read a negative
        # max_length the same way, so one call covers both.
        cache.crop(-remove)


@functools.cache
def _cache_kwarg(model_cls: type) -> str:
    # transformers >= 5.2x names the argument `cache` and deprecates `past_key_values`.
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward(model: Any, ids: torch.Tensor, cache: Any, keep: int) -> torch.Tensor:
    kwargs = {_cache_kwarg(type(model)): cache}
    return model(input_ids=ids, use_cache=True, logits_to_keep=keep, **kwargs).logits


def _prefill(model: Any, prompt: torch.Tensor, cache: Any, v: int) -> torch.Tensor:
    """Run the whole prompt; return the logits ``[1, V]`` that predict the first new token.

    Using them saves one pass per request per model (the first round then feeds only the
    drafts to the target, and nothing to the draft before its first proposal).
    """
    return _forward(model, prompt, cache, keep=1)[:, -1, :v]
