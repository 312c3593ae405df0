"""A loaded target + draft pair: loading, vocabulary checks, description, prompt encoding.

:func:`load_pair` loads two causal LMs (``AutoModelForCausalLM``) and their shared tokenizer
on one device; :func:`make_pair` wraps models already in memory (tests, benchmarks) after
checking that both score one vocabulary (THEORY §1: p and q are distributions over the same
``V`` tokens). ``Pair.info`` describes the models for the run manifest
(docs/ARCHITECTURE.md "Logs").

torch and transformers are imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaxspec_audit.collect.config import DEVICE_PATTERN

if TYPE_CHECKING:
    import torch


class DecodeError(ValueError):
    """A model pair or a request that cannot be decoded (mismatched vocabularies, ...)."""


#: A hub id: ``owner/name`` (one slash, the hub's characters). Anything else that is not an
#: existing folder is a path typo, refused before transformers can try the network.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")

#: The special tokens whose ids must agree between the target's and the draft's tokenizers:
#: they end requests and open prompts. Others (pad, unk) that differ are reported only.
_SPECIALS_REFUSED = ("eos_token_id", "bos_token_id")
_SPECIALS_REPORTED = ("pad_token_id", "unk_token_id")


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
        notes: what the tokenizer comparison reported without refusing (added tokens only
            one side has, differing pad/unk ids, a draft without tokenizer files).
    """

    target: Any
    draft: Any | None
    tokenizer: Any | None
    device: Any
    dtype: Any
    vocab_size: int
    eos_ids: frozenset[int]
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- loading


def check_device(device: Any) -> str:
    """``device`` if it is ``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N`` (no torch import).

    Raises:
        DecodeError: naming the value and the accepted forms.
    """
    if not isinstance(device, str) or DEVICE_PATTERN.fullmatch(device) is None:
        raise DecodeError(f"device: must be auto, cpu, mps, cuda or cuda:N, got {device!r}")
    return device


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` → cuda if available, else cpu; anything else as torch reads it.

    Raises:
        DecodeError: a malformed device string, or CUDA asked where it is not available.
    """
    check_device(device)
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DecodeError(f"device: {device!r} asked but CUDA is not available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DecodeError(
            f"device: {device!r} asked but only {torch.cuda.device_count()} CUDA device(s) exist"
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise DecodeError(f"device: {device!r} asked but MPS is not available")
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


def logit_size(model: Any) -> int:
    """The number of logit columns a causal LM returns (its output embedding's rows)."""
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
        "vocab_size": logit_size(model),
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


def _id_to_token(tokenizer: Any) -> dict[int, str]:
    return {int(i): tok for tok, i in tokenizer.get_vocab().items()}


def _added_ids(tokenizer: Any) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}) or {}}


def _first(ids: list[int], names: dict[int, str], n: int = 5) -> str:
    return ", ".join(f"{i} {names[i]!r}" for i in ids[:n]) + (" ..." if len(ids) > n else "")


def compare_tokenizers(target_tok: Any, draft_tok: Any) -> list[str]:
    """Refuse a draft tokenizer that maps an id to another token string than the target's.

    THEORY §1 compares p and q id by id, so an id must name one token on both sides. Checked:
    the token string of every id both tokenizers have; ids of the base vocabulary only one
    side has; the EOS and BOS ids. Added tokens only one side has, and differing pad/unk ids,
    are reported (returned, and warned) but not refused: the target's tokenizer encodes
    every prompt, and such ids only matter if a model emits them.

    Returns:
        Notes on what differs without being refused (empty when the tokenizers agree).

    Raises:
        DecodeError: naming the first differing ids and their token strings, or the
            differing special ids.
    """
    if draft_tok is target_tok:
        return []
    t_map, d_map = _id_to_token(target_tok), _id_to_token(draft_tok)
    shared = t_map.keys() & d_map.keys()
    differ = sorted(i for i in shared if t_map[i] != d_map[i])
    if differ:
        pairs = ", ".join(f"id {i}: target {t_map[i]!r}, draft {d_map[i]!r}" for i in differ[:5])
        raise DecodeError(
            f"tokenizer mismatch: {len(differ)} of {len(shared)} shared ids name different "
            f"tokens in the target's and the draft's tokenizers (first: {pairs}); "
            "speculative decoding needs a pair that shares one vocabulary"
        )
    notes = []
    for side, mine, other, added in (
        ("target", t_map, d_map, _added_ids(target_tok)),
        ("draft", d_map, t_map, _added_ids(draft_tok)),
    ):
        only = sorted(mine.keys() - other.keys())
        base = [i for i in only if i not in added]
        if base:
            raise DecodeError(
                f"tokenizer mismatch: the {side}'s tokenizer has {len(base)} vocabulary ids "
                f"the other lacks (first: {_first(base, mine)})"
            )
        if only:
            notes.append(
                f"added tokens only the {side}'s tokenizer has: {len(only)} ({_first(only, mine)})"
            )
    for name in (*_SPECIALS_REFUSED, *_SPECIALS_REPORTED):
        t_id, d_id = getattr(target_tok, name, None), getattr(draft_tok, name, None)
        if t_id == d_id:
            continue
        what = f"{name}: target {t_id}, draft {d_id}"
        if name in _SPECIALS_REFUSED and t_id is not None and d_id is not None:
            raise DecodeError(f"tokenizer mismatch: special ids differ ({what})")
        notes.append(f"special ids differ ({what})")
    for note in notes:
        warnings.warn(f"target/draft tokenizers: {note}", UserWarning, stacklevel=3)
    return notes


def make_pair(
    target: Any,
    draft: Any | None,
    tokenizer: Any | None = None,
    *,
    sources: tuple[str | None, str | None] = (None, None),
    draft_tokenizer: Any | None = None,
) -> Pair:
    """Wrap two already loaded models as a :class:`Pair` after checking their vocabularies.

    The logit sizes must agree. Real pairs sometimes pad the embedding matrix differently
    (e.g. 152064 vs 151936 rows); that is accepted only when the shared tokenizer covers
    fewer ids than both, and ``V`` is then the smaller size (padded ids are never produced).
    With ``draft_tokenizer`` (the draft's own), the two tokenizers must agree id by id
    (:func:`compare_tokenizers`); a size check alone passes a reordered vocabulary.

    Raises:
        DecodeError: mismatched vocabularies (both sizes named), mismatched tokenizers (the
            first differing ids named) or models on two devices.
    """
    notes: list[str] = []
    if draft is not None and tokenizer is not None and draft_tokenizer is not None:
        notes = compare_tokenizers(tokenizer, draft_tokenizer)
    v_target = logit_size(target)
    vocab = v_target
    if draft is not None:
        v_draft = logit_size(draft)
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
        notes=notes,
    )


def load_tokenizer(source: str) -> Any:
    """Load a tokenizer; a plain ``tokenizer.json`` is used exactly as saved.

    transformers 5 maps a saved generic fast tokenizer (``tokenizer_class`` =
    ``TokenizersBackend`` / ``PreTrainedTokenizerFast``) to the model type's own tokenizer
    class, which can replace the saved pre-tokenizer (a Qwen2 config turns a character
    tokenizer into a byte-level one). Such folders are loaded with the generic class.
    """
    from transformers import AutoTokenizer

    kwargs = {} if Path(source).expanduser().exists() else {"local_files_only": _offline()}
    cfg_path = Path(source) / "tokenizer_config.json"
    if cfg_path.is_file():
        cls_name = json.loads(cfg_path.read_text()).get("tokenizer_class")
        if cls_name in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            import transformers

            cls = getattr(transformers, "TokenizersBackend", None)
            cls = cls or transformers.PreTrainedTokenizerFast
            return cls.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source, **kwargs)


def _offline() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def check_model_source(role: str, source: str) -> bool:
    """Is ``source`` a local folder (True) or a hub id (False)? Refuse anything else.

    A name that is neither an existing path nor of the hub's ``owner/name`` form is a path
    typo: it is refused here, before transformers would ask the hub for it. A hub id is
    looked up in the local cache only when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``)
    is set.

    Raises:
        DecodeError: naming the role, the path as given and where it resolves.
    """
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DecodeError(f"{role}: {source} is a file, not a model folder")
        return True
    # A first component that is a local folder says the name was meant as a path.
    explicit = source.startswith(("/", ".", "~")) or Path(source.split("/")[0]).is_dir()
    if explicit or _HUB_ID.fullmatch(source) is None:
        raise DecodeError(
            f"{role}: no model at {source} (resolved to {path.absolute()}): not an existing "
            "folder, and not a hub id of the form owner/name"
        )
    return False


def _load_model(role: str, source: str, local: bool, torch_dtype: Any, dev: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` with errors that name the role and source."""
    from transformers import AutoModelForCausalLM

    kwargs = {} if local else {"local_files_only": _offline()}
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as exc:
        where = "folder" if local else "hub id" + (" (offline: local cache only)" * _offline())
        raise DecodeError(f"{role}: cannot load a causal LM from {where} {source}: {exc}") from exc
    return model.to(dev).eval()


def load_pair(
    target: str,
    draft: str | None,
    device: str = "auto",
    dtype: str = "auto",
    tokenizer: str | None = None,
    *,
    allow_untokenized_draft: bool = False,
) -> Pair:
    """Load a target and a draft causal LM (``AutoModelForCausalLM``) on one device.

    The draft's own tokenizer is loaded too and compared with the target's id by id
    (:func:`compare_tokenizers`).

    Args:
        target: path or hub id of the target.
        draft: path or hub id of the draft; None for target-only decoding.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``.
        dtype: ``"auto"`` or a dtype name (see :func:`resolve_dtype`).
        tokenizer: where to load the tokenizer from (default: the target, then the draft).
        allow_untokenized_draft: accept a draft without tokenizer files (its vocabulary then
            cannot be checked beyond its size; CLI ``--allow-draft-without-tokenizer``).

    Raises:
        DecodeError: a bad device, a path that does not exist, no tokenizer, a draft without
            tokenizer files (unless allowed), mismatched vocabularies or tokenizers.
    """
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    roles = {"target": target, "draft": draft}
    local = {r: check_model_source(r, path) for r, path in roles.items() if path is not None}
    tok, tok_source = None, None
    errors = []
    for source in [tokenizer] if tokenizer else [target, draft]:
        if source is None:
            continue
        try:
            tok, tok_source = load_tokenizer(source), source
            break
        except (OSError, ValueError, TypeError) as exc:
            errors.append(f"{source}: {exc}")
    if tok is None:
        raise DecodeError("no tokenizer found: " + "; ".join(errors))
    draft_tok = None
    if draft is not None:
        if tok_source == draft:
            draft_tok = tok
        else:
            try:
                draft_tok = load_tokenizer(draft)
            except (OSError, ValueError, TypeError) as exc:
                if not allow_untokenized_draft:
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise DecodeError(
                        f"draft: no tokenizer at {draft} ({first}); its vocabulary cannot be "
                        "checked against the target's. Pass allow_untokenized_draft=True "
                        "(CLI --allow-draft-without-tokenizer) to decode with the target's"
                    ) from exc

    draft_model = None
    if draft is not None:
        draft_model = _load_model("draft", draft, local["draft"], torch_dtype, dev)
    target_model = _load_model("target", target, local["target"], torch_dtype, dev)
    sources = (target, draft)
    pair = make_pair(target_model, draft_model, tok, sources=sources, draft_tokenizer=draft_tok)
    if draft is not None and draft_tok is None:
        pair.notes.append(f"draft {draft} has no tokenizer files (allowed by the caller)")
    return pair


def encode_prompt(pair: Pair, prompt: str) -> list[int]:
    """Token ids of a prompt (``tokenizer(prompt)``; the BOS token if that is empty)."""
    if pair.tokenizer is None:
        raise DecodeError("the pair has no tokenizer; pass prompt token ids")
    ids = list(pair.tokenizer(prompt)["input_ids"])
    if not ids and pair.tokenizer.bos_token_id is not None:
        ids = [int(pair.tokenizer.bos_token_id)]
    return ids


def max_positions(pair: Pair) -> tuple[int | None, str]:
    """The positions both models can attend over, and which model sets that limit.

    ``config.max_position_embeddings`` of the target and the draft (the smaller); None
    when neither config sets it.
    """
    limit, who = None, ""
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            continue
        cfg = model.config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        n = getattr(cfg, "max_position_embeddings", None)
        if isinstance(n, int) and n > 0 and (limit is None or n < limit):
            limit, who = n, role
    return limit, who


def check_prompt_fits(pair: Pair, item_id: str, n_prompt: int, need: int) -> None:
    """Refuse a prompt of ``n_prompt`` tokens that leaves no room for ``need`` more positions.

    ``need`` is ``max_new_tokens + K + 1``: the output, the drafts of the last round and the
    bonus slot (THEORY §1). A model run past its configured positions still returns logits,
    so without this check a too-long prompt decodes "successfully".

    Raises:
        DecodeError: naming the item, the prompt length, ``need`` and the model's limit.
    """
    limit, who = max_positions(pair)
    if limit is not None and n_prompt + need > limit:
        raise DecodeError(
            f"item {item_id}: the prompt has {n_prompt} tokens and decoding needs {need} more "
            f"positions (max_new_tokens + K + 1), {n_prompt + need} in all, but the {who} "
            f"model's context is {limit} (config.max_position_embeddings); shorten the "
            "prompt or lower max_new_tokens"
        )


def check_prompts_fit(
    pair: Pair, requests: list[tuple[str, list[int]]], max_new_tokens: int, k: int
) -> None:
    """:func:`check_prompt_fits` for every ``(item_id, prompt_ids)``, before any decoding.

    ``k`` is the run's K (0 for target-only decoding).

    Raises:
        DecodeError: an empty prompt, or one too long (:func:`check_prompt_fits`), named.
    """
    for item_id, ids in requests:
        if not ids:
            raise DecodeError(f"item {item_id}: empty prompt (no token ids)")
        check_prompt_fits(pair, item_id, len(ids), max_new_tokens + k + 1)


def describe(pair: Pair) -> str:
    """One JSON line describing a pair (for logs and benchmark headers)."""
    return json.dumps({k: pair.info[k] for k in ("vocab_size", "device", "dtype")})
