"""The collect stage: run config → model pair → the decode engine → log rows → run folder.

Modules, one idea each:

- ``config``: :class:`RunConfig`, one validated, frozen, serialisable object per run.
- ``logs``: the versioned log schema, the atomic resumable run writer and the reader.
- ``pair``: loading and checking a target + draft pair, prompt encoding.
- ``sampling``: the sampling transform shared by p and q, the request's coupled uniforms.
- ``adapter``: the model adapter the engine calls (FastLM's static caches, or
  transformers' own caches for any causal LM), chosen once per pair.
- ``fastmodel``: FastLM, a Llama-family forward over static caches at per-row positions.
- ``round``: the pieces of one decode round (draft, verify, decide, the one host copy).
- ``batched``: the engine: B rows per pass, continuous batching, ``decode_request``.
- ``roundlog``: the per-position and per-round rows, computed in batches off the hot loop.
- ``run``: :func:`collect`, the driver that writes one run folder.

The public names below are imported on first use, so that importing this package (and its
light ``config`` and ``logs`` modules) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "ConfigError": "config",
    "RunConfig": "config",
    "TARGET_ONLY": "config",
    "LogError": "logs",
    "RequestRows": "logs",
    "RunWriter": "logs",
    "find_runs": "logs",
    "read_manifest": "logs",
    "scan": "logs",
    "DecodeError": "pair",
    "describe": "pair",
    "resolve_device": "pair",
    "resolve_dtype": "pair",
    "Pair": "pair",
    "encode_prompt": "pair",
    "load_pair": "pair",
    "make_pair": "pair",
    "transform_logits": "sampling",
    "decode_request": "batched",
    "collect": "run",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_PUBLIC[name]}")
    return getattr(module, name)
