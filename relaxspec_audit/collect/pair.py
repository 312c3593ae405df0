"""A loaded target + draft pair: loading, vocabulary checks, description, prompt encoding.

:func:`load_pair` loads two causal LMs (``AutoModelForCausalLM``) and their shared tokenizer
on one device; :func:`make_pair` wraps models already in memory (tests, benchmarks) after
checking that both score one vocabulary (THEORY §1: p and q are distributions over the same
``V`` tokens). ``Pair.info`` describes the models for the run manifest (DESIGN "Logs").

torch and transformers are imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class DecodeError(ValueError):
    """A model pair or a request that cannot be decoded (mismatched vocabularies, ...)."""


@dataclass
class Pair:
    """A loaded target + draft pair on one device.

    Attributes:
        target: the target causal LM (eval mode).
        draft: the draft causal LM, or None for target-only decoding.
        tokenizer: the shared tokenizer (None: prompts must be token ids).
        device: the torch device both models live on.
        dtype: the models' torch dtype.
        vocab_size: ``V``, the number of logit columns compared between the two models.
        eos_ids: token ids that end a request.
        info: description for the manifest (paths, config hashes, revisions, tokenizer).
    """

    target: Any
    draft: Any | None
    tokenizer: Any | None
    device: Any
    dtype: Any
    vocab_size: int
    eos_ids: frozenset[int]
    info: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- loading


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` → cuda if available, else cpu; anything else as torch reads it."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DecodeError(f"device: {device!r} asked but CUDA is not available")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` → float32 on cpu, bfloat16 on cuda (float16 where bf16 is unsupported)."""
    import torch

    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in ("float32", "float16", "bfloat16"):
        raise DecodeError(f"dtype: must be auto, float32, float16 or bfloat16, got {dtype!r}")
    return getattr(torch, dtype)


def _logit_size(model: Any) -> int:
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def _model_info(model: Any, source: str | None) -> dict[str, Any]:
    cfg = model.config
    cfg_json = cfg.to_json_string(use_diff=False)
    return {
        "path": source or getattr(cfg, "_name_or_path", None),
        "class": type(model).__name__,
        "model_type": getattr(cfg, "model_type", None),
        "vocab_size": _logit_size(model),
        "n_params": int(sum(t.numel() for t in model.parameters())),
        "config_sha256": hashlib.sha256(cfg_json.encode()).hexdigest(),
        "revision": getattr(cfg, "_commit_hash", None),
    }


def _eos_ids(target: Any, tokenizer: Any | None) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(target, "generation_config", None), target.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def make_pair(
    target: Any,
    draft: Any | None,
    tokenizer: Any | None = None,
    *,
    sources: tuple[str | None, str | None] = (None, None),
) -> Pair:
    """Wrap two already loaded models as a :class:`Pair` after checking their vocabularies.

    The logit sizes must agree. Real pairs sometimes pad the embedding matrix differently
    (e.g. 152064 vs 151936 rows); that is accepted only when the shared tokenizer covers
    fewer ids than both, and ``V`` is then the smaller size (padded ids are never produced).

    Raises:
        DecodeError: mismatched vocabularies (both sizes named) or models on two devices.
    """
    v_target = _logit_size(target)
    vocab = v_target
    if draft is not None:
        v_draft = _logit_size(draft)
        if v_draft != v_target:
            n_tok = len(tokenizer) if tokenizer is not None else None
            if n_tok is None or n_tok > min(v_target, v_draft):
                raise DecodeError(
                    f"vocabulary mismatch: target has {v_target} logits, draft has {v_draft}"
                    f" (tokenizer: {n_tok if n_tok is not None else 'none'} ids); speculative"
                    " decoding needs a pair that shares one vocabulary"
                )
            vocab = min(v_target, v_draft)
        t_dev = next(target.parameters()).device
        d_dev = next(draft.parameters()).device
        if t_dev != d_dev:
            raise DecodeError(f"target is on {t_dev} but draft is on {d_dev}")
    target.eval()
    if draft is not None:
        draft.eval()
    param = next(target.parameters())
    info = {
        "target": _model_info(target, sources[0]),
        "draft": _model_info(draft, sources[1]) if draft is not None else None,
        "vocab_size": vocab,
        "tokenizer": None
        if tokenizer is None
        else {
            "class": type(tokenizer).__name__,
            "name_or_path": getattr(tokenizer, "name_or_path", None),
            "len": len(tokenizer),
        },
        "device": str(param.device),
        "dtype": str(param.dtype).removeprefix("torch."),
    }
    return Pair(
        target=target,
        draft=draft,
        tokenizer=tokenizer,
        device=param.device,
        dtype=param.dtype,
        vocab_size=vocab,
        eos_ids=_eos_ids(target, tokenizer),
        info=info,
    )


def load_tokenizer(source: str) -> Any:
    """Load a tokenizer; a plain ``tokenizer.json`` is used exactly as saved.

    transformers 5 maps a saved generic fast tokenizer (``tokenizer_class`` =
    ``TokenizersBackend`` / ``PreTrainedTokenizerFast``) to the model type's own tokenizer
    class, which can replace the saved pre-tokenizer (a Qwen2 config turns a character
    tokenizer into a byte-level one). Such folders are loaded with the generic class.
    """
    from transformers import AutoTokenizer

    cfg_path = Path(source) / "tokenizer_config.json"
    if cfg_path.is_file():
        cls_name = json.loads(cfg_path.read_text()).get("tokenizer_class")
        if cls_name in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            import transformers

            cls = getattr(transformers, "TokenizersBackend", None)
            cls = cls or transformers.PreTrainedTokenizerFast
            return cls.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source)


def load_pair(
    target: str,
    draft: str | None,
    device: str = "auto",
    dtype: str = "auto",
    tokenizer: str | None = None,
) -> Pair:
    """Load a target and a draft causal LM (``AutoModelForCausalLM``) on one device.

    Args:
        target: path or hub id of the target.
        draft: path or hub id of the draft; None for target-only decoding.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        dtype: ``"auto"`` or a dtype name (see :func:`resolve_dtype`).
        tokenizer: where to load the tokenizer from (default: the target, then the draft).

    Raises:
        DecodeError: a path that does not exist, no tokenizer, or mismatched vocabularies.
    """
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    for name, path in (("target", target), ("draft", draft)):
        if path is not None and path.startswith(("/", ".")) and not Path(path).exists():
            raise DecodeError(f"{name}: no model at {path}")
    tok = None
    errors = []
    for source in [tokenizer] if tokenizer else [target, draft]:
        if source is None:
            continue
        try:
            tok = load_tokenizer(source)
            break
        except (OSError, ValueError, TypeError) as exc:
            errors.append(f"{source}: {exc}")
    if tok is None:
        raise DecodeError("no tokenizer found: " + "; ".join(errors))

    def load(path: str) -> Any:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        return model.to(dev).eval()

    draft_model = load(draft) if draft is not None else None
    return make_pair(load(target), draft_model, tok, sources=(target, draft))


def encode_prompt(pair: Pair, prompt: str) -> list[int]:
    """Token ids of a prompt (``tokenizer(prompt)``; the BOS token if that is empty)."""
    if pair.tokenizer is None:
        raise DecodeError("the pair has no tokenizer; pass prompt token ids")
    ids = list(pair.tokenizer(prompt)["input_ids"])
    if not ids and pair.tokenizer.bos_token_id is not None:
        ids = [int(pair.tokenizer.bos_token_id)]
    return ids


def describe(pair: Pair) -> str:
    """One JSON line describing a pair (for logs and benchmark headers)."""
    return json.dumps({k: pair.info[k] for k in ("vocab_size", "device", "dtype")})
