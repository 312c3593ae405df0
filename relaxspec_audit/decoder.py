"""The logging speculative decoder: a target + draft pair, KV-cache rollback, coupled randomness.

One round (SPEC §1): the draft proposes ``K`` tokens autoregressively with its KV cache;
the target scores the last emitted token and the ``K`` drafts in ONE forward pass with its
KV cache, giving ``p_1..p_{K+1}``; the rule of ``rules.py`` accepts a prefix of length
``a`` and emits a recovery (``a < K``) or bonus token; both caches are cropped back to the
emitted sequence (never recomputed). The emitted token is fed at the start of the next round.
Drafting stops early at a draft EOS or at the length limit, where no later draft could be
emitted; the shorter block decides exactly as the full one (``Block.k_nominal`` keeps
ASD's gate on the run's K), and ``rounds.k`` records the drafts made.

Cache invariant: between rounds both caches hold every token of ``prompt + output`` except
the last one. The draft's prefill runs the whole prompt and its last logits give ``q_1`` of
the first round; the target has no separate prefill: round 0 scores prompt + drafts in one
pass (as transformers' assisted generation does). The draft never ran on ``x_K``; when all
``K`` drafts were accepted its cache is one token short and the next round feeds it
``[x_K, bonus]``.

Randomness is coupled (SPEC §4): every draw is ``rng.uniforms(seed, request_key, abs_pos,
purpose)`` used through the inverse CDF, so runs of different rules with one seed share
their stream position by position. The ``K + 1`` uniforms of each purpose are drawn on the
host with numpy and copied to the device in one transfer per round.

Every round copies to the host only what decoding needs (the drafts, the accepted length,
the emitted token, the ASD ledger: one small copy). The rule runs with
``Block(diagnostics=False)``, computing only what its decision needs. With logging on, the
round hands references to p, q, the target logits and the rule's decisions to
:class:`_RoundLog`, which computes the per-position statistics (``rules.token_stats`` of
drafts and emitted tokens, ``E_S`` on the θ grid) batched over up to 64 rounds, copies them
to the host in one transfer per batch and builds the rows with numpy at the end of the
request. So the logging cost is a few batched kernels per request, not per round.

A round that would overshoot ``max_new_tokens`` or runs past an EOS is truncated: only
the emitted tokens are kept; the draft rows after the cut and the recovery/bonus row of
that round are not logged (they were never emitted).

torch and transformers are imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from relaxspec_audit import rng
from relaxspec_audit.config import TARGET_ONLY, RunConfig
from relaxspec_audit.logs import RequestRows, output_sha256
from relaxspec_audit.rules import TOKEN_STAT_KEYS

if TYPE_CHECKING:
    import torch

__all__ = [
    "DecodeError",
    "Pair",
    "collect",
    "decode_request",
    "load_pair",
    "make_pair",
    "resolve_device",
    "resolve_dtype",
    "transform_logits",
]

# Diagnostics of draft rows that come from the rule's decision (BlockResult.diag); every
# other column of a position row is rules.token_stats, computed by _RoundLog off the round.
_RULE_KEYS = ("passed_ratio", "accepted", "cause")
# token_stats of any logged token (drafts, recovery, bonus), in transfer order.
_STAT_KEYS = TOKEN_STAT_KEYS
_INT_COLS = ("rank", "target_argmax")
# The host layout of token_stats in _RoundLog: float keys, then the integer/bool keys.
_INT_STATS = ("rank", "target_argmax", "in_nucleus")
_HOST_STATS = tuple(c for c in _STAT_KEYS if c not in _INT_STATS) + _INT_STATS
_BOOL_COLS = ("passed_ratio", "in_nucleus", "accepted")
# _RoundLog keeps p, q and the target logits of pending rounds alive (about (3K + 2)·V
# floats per round) and flushes when that would pass this many floats (64 MB in float32)
# or _FLUSH_MAX_ROUNDS rounds.
_FLUSH_FLOATS = 1 << 24
_FLUSH_MAX_ROUNDS = 64
_CPU_CHUNK = 1 << 17  # elements per token_stats call on CPU (see _RoundLog._flush)
# Stop drafting at a draft EOS (nothing after it can be emitted). Off only in the test that
# checks outputs are unchanged by it.
_STOP_DRAFT_AT_EOS = True


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


# ----------------------------------------------------------------------------- sampling


def transform_logits(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The sampling transform shared by p and q: temperature, top-k, top-p, softmax.

    Temperature 0 is greedy mode: p and q are ``softmax(logits)`` at temperature 1, kept
    for diagnostics and distribution-based rules (docs/ARCHITECTURE.md, greedy mode).

    Args:
        logits: ``[..., V]`` raw logits.
        temperature: ≥ 0.
        top_k: keep the k most likely tokens (ties by id, as the stable sort orders them).
        top_p: keep the smallest most-likely set with mass ≥ top_p.

    Returns:
        ``[..., V]`` float32 probabilities.
    """
    import torch

    z = logits.float()
    if temperature == 0:
        return torch.softmax(z, dim=-1)
    z = z / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]  # [..., 1]
        z = z.masked_fill(z < kth, -math.inf)
    if top_p is not None and top_p < 1.0:
        probs = torch.softmax(z, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        # keep a token iff the mass strictly before it is < top_p (the top-p nucleus)
        drop_sorted = (torch.cumsum(sorted_p, -1) - sorted_p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, -math.inf)
    return torch.softmax(z, dim=-1)


# ----------------------------------------------------------------------------- decoding


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


class _Timer:
    """Wall-clock sections; synchronises CUDA only when timing is on."""

    def __init__(self, device: Any, enabled: bool):
        self.cuda = enabled and device.type == "cuda"
        self.enabled = enabled

    def now(self) -> float:
        if not self.enabled:
            return 0.0
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()


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


def _eos_check_per_step(device: torch.device) -> bool:
    """Read each draft on the host to stop at a draft EOS (else once per round)?

    A host read is free on CPU; on CUDA it would stall the queue of kernel launches at every
    draft step, so there the drafts are read once per round (the block still ends at the
    first EOS: the logs are the same, only the draft passes after an EOS are not saved).
    """
    return device.type != "cuda"


def _rule_theta(config: RunConfig) -> float:
    from relaxspec_audit.rules import DEFAULT_THETA

    if config.rule == "nucleus":
        return float(config.params.get("theta", DEFAULT_THETA))
    return DEFAULT_THETA


def es_grid_topm(p: torch.Tensor, q: torch.Tensor, grid: list[float], m: int = 32) -> np.ndarray:
    """``rules.es_grid`` computed on each row's top tokens, exact, on the host.

    A token can only be in a nucleus ``N_θ`` (θ ≤ max grid) if the mass ranked before it is
    below θ. When the mass of the top-m tokens strictly above the m-th probability reaches
    max θ, no token outside the top m (and none tied with the m-th) is in any nucleus of
    the grid, and every nucleus member's ``mass_above`` is the same inside the top m as in
    the whole vocabulary: E_S is exact. Rows where that fails (flatter p) are retried with
    4× more tokens, and finally on the full vocabulary. This replaces a sort over V per
    position (the cost of E_S) by a top-k for the usual peaked rows.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities.
        grid: θ values in (0, 1].
        m: tokens kept per row in the first stage (then 4m, 16m, ... while below V/4).

    Returns:
        ``[..., G]`` float32 numpy array, E_S at each θ.
    """
    import torch

    from relaxspec_audit.rules import es_grid

    v = p.shape[-1]
    lead = p.shape[:-1]
    p2, q2 = p.reshape(-1, v), q.reshape(-1, v)  # [N, V]
    out = np.full((p2.shape[0], len(grid)), np.nan, dtype=np.float32)
    todo = np.arange(p2.shape[0])
    while 4 * m < v and max(grid) < 1.0 and todo.size:
        if todo.size == p2.shape[0]:
            pr, qr = p2, q2
        else:
            rows = torch.from_numpy(todo).to(p.device)
            pr, qr = p2[rows], q2[rows]  # [n, V]
        top_p, idx = torch.topk(pr, m, dim=-1)  # [n, m], descending
        idx = idx.sort(dim=-1).values  # id order: es_grid's stable sort breaks ties by id
        t = top_p[:, -1:]  # [n, 1] the m-th probability
        above = torch.where(top_p > t, top_p.double(), 0.0).sum(-1)  # [n] mass above t
        es = es_grid(pr.gather(-1, idx), qr.gather(-1, idx), grid)  # [n, G]
        both = torch.cat([es.double(), above.unsqueeze(-1)], -1).cpu().numpy()  # one copy
        safe = both[:, -1] >= max(grid)
        out[todo[safe]] = both[safe, :-1]
        todo = todo[~safe]
        m *= 4
    if todo.size == p2.shape[0]:
        out = es_grid(p2, q2, grid).cpu().numpy()
    elif todo.size:
        rows = torch.from_numpy(todo).to(p.device)
        out[todo] = es_grid(p2[rows], q2[rows], grid).cpu().numpy()
    return out.reshape(*lead, len(grid))


def decode_request(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    *,
    timing: bool = True,
    rule_fn: Callable[..., Any] | None = None,
) -> RequestRows:
    """Decode one request under ``config.rule`` and return its log rows.

    Args:
        pair: the loaded pair (:func:`load_pair` / :func:`make_pair`).
        prompt_ids: the prompt's token ids (at least one).
        config: the run configuration (rule, params, K, sampling, seed, ...).
        request_id: the request key; it keys the coupled random stream (SPEC §4).
        timing: measure ``draft_s`` / ``verify_s`` (synchronises CUDA when on).
        rule_fn: replace the registered rule function (tests of deliberately broken rules).

    Returns:
        ``positions``, ``rounds`` and the ``requests`` row (without item, task, split,
        text and score, which :func:`collect` adds).
    """
    import torch

    if not prompt_ids:
        raise DecodeError(f"request {request_id}: empty prompt (no token ids)")
    t_start = time.perf_counter()
    with torch.inference_mode():
        if config.rule == TARGET_ONLY:
            out = _decode_target_only(pair, prompt_ids, config, request_id, timing)
        else:
            if pair.draft is None:
                raise DecodeError(f"rule {config.rule!r} needs a draft model; the pair has none")
            out = _decode_speculative(pair, prompt_ids, config, request_id, timing, rule_fn)
    output_ids, stop, passes, positions, rounds = out
    request = {
        "prompt_ids": list(map(int, prompt_ids)),
        "output_ids": output_ids,
        "output_sha256": output_sha256(output_ids),
        "n_tokens": len(output_ids),
        "stop": stop,
        "target_passes": passes,
        "wall_s": time.perf_counter() - t_start,
    }
    return RequestRows(request_id, positions, rounds, request)


def _host_uniforms(config: RunConfig, key: int, start: int, n: int) -> np.ndarray:
    pos = np.arange(start, start + n, dtype=np.int64)
    return np.stack(
        [
            rng.uniforms(config.seed, key, pos, rng.Purpose.DRAFT),
            rng.uniforms(config.seed, key, pos, rng.Purpose.ACCEPT),
            rng.uniforms(config.seed, key, pos, rng.Purpose.SAMPLE),
        ]
    )  # [3, n]


def _decode_speculative(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    timing: bool,
    rule_fn: Callable[..., Any] | None,
) -> tuple[list[int], str, int, dict[str, Any], dict[str, Any]]:
    import torch

    from relaxspec_audit import rules

    dev, v, k = pair.device, pair.vocab_size, config.k
    spec = rules.RULES[config.rule]
    fn = rule_fn or spec.fn
    params = config.rule_params()
    greedy = config.greedy
    theta = _rule_theta(config)
    grid = list(config.theta_grid)
    log = config.log_positions
    key = rng.request_key(request_id)
    timer = _Timer(dev, timing)

    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=dev)  # [1, L]
    t_cache, d_cache = _new_cache(pair.target), _new_cache(pair.draft)
    # The target has no prefill of its own: round 0 verifies prompt + drafts in one pass.
    d_next = _prefill(pair.draft, prompt, d_cache, v)  # [1, V], q_1 of round 0
    seq = list(map(int, prompt_ids))  # prompt + output, host side
    n_prompt = len(seq)
    state = None  # per-request rule state (the ASD ledger `spent`)
    round_rows: list[tuple] = []
    stop = "length"
    passes = 0
    # Every uniform the request can use (SPEC §4: keyed by absolute position), drawn on the
    # host once and copied to the device in one transfer; rounds take slices.
    u_all = _host_uniforms(config, key, 0, config.max_new_tokens + k + 1)  # [3, N+K+1]
    u_all_dev = torch.from_numpy(u_all).to(dev)
    plog = _RoundLog(k, v, theta, grid, u_all) if log else None
    # Stop drafting at a draft EOS (_eos_check_per_step: per step on CPU, per round on CUDA;
    # either way the block ends at the first EOS, so the logs do not depend on the device).
    eos_stop = _STOP_DRAFT_AT_EOS and bool(pair.eos_ids)
    eos_step = eos_stop and _eos_check_per_step(dev)
    eos_round = eos_stop and not eos_step
    while len(seq) - n_prompt < config.max_new_tokens:
        start = len(seq) - n_prompt  # abs_pos of x_1
        u_dev = u_all_dev[:, start : start + k + 1]  # [3, K+1]
        t0 = timer.now()
        # --- draft: up to K tokens autoregressively; feed what its cache lacks (1 or 2
        # tokens). No draft past the length limit or after a draft EOS can be emitted, so
        # drafting stops there (the block is shorter; decisions on it are unchanged).
        k_cap = min(k, config.max_new_tokens - start)
        feed = torch.tensor([seq[d_cache.get_seq_length() :]], dtype=torch.long, device=dev)
        drafts, q_rows = [], []
        for i in range(k_cap):
            if d_next is not None:  # first round: the prefill already predicted x_1
                logits, d_next = d_next, None
            else:
                logits = _forward(pair.draft, feed, d_cache, keep=1)[:, -1, :v]  # [1, V]
            q_i = transform_logits(logits, config.temperature, config.top_k, config.top_p)
            if greedy:
                x_i = logits.argmax(-1)  # [1]
            else:
                x_i = rng.sample_icdf(q_i, u_dev[0, i : i + 1])  # [1]
            drafts.append(x_i)
            q_rows.append(q_i)
            feed = x_i.view(1, 1)
            if eos_step and int(x_i) in pair.eos_ids:  # a host read: free on CPU
                break
        drafts_t = torch.stack(drafts, 1)  # [1, k_r]
        if eos_round:  # one device read per round instead of one per draft step
            x_list = drafts_t[0].tolist()
            k_r = next((j + 1 for j, t in enumerate(x_list) if t in pair.eos_ids), len(drafts))
            drafts_t, q_rows = drafts_t[:, :k_r], q_rows[:k_r]
        k_r = drafts_t.shape[1]
        q = torch.stack(q_rows, 1)  # [1, k_r, V]
        t1 = timer.now()
        # --- verify: what the target cache lacks (the last emitted token; the whole prompt
        # in round 0) + the k_r drafts in ONE target pass; keep the last k_r + 1 rows.
        missing = torch.tensor([seq[t_cache.get_seq_length() :]], dtype=torch.long, device=dev)
        t_in = torch.cat([missing, drafts_t], 1)  # [1, n + k_r]
        z = _forward(pair.target, t_in, t_cache, keep=k_r + 1)[..., :v].float()  # [1, k_r+1, V]
        passes += 1
        p = transform_logits(z, config.temperature, config.top_k, config.top_p)  # [1, k_r+1, V]
        block = rules.Block(
            drafts=drafts_t,
            p=p,
            q=q,
            target_logits=z,
            u_accept=u_dev[1:2, :k_r],
            u_sample=u_dev[2:3, : k_r + 1],
            greedy=greedy,
            k_nominal=k,
            diagnostics=False,  # the rest of the diagnostics: _RoundLog, batched over rounds
        )
        res = fn(block, params, state)
        state = res.state
        spent = (
            res.state.to(torch.float64)
            if res.state is not None
            else torch.full((1,), math.nan, dtype=torch.float64, device=dev)
        )
        # float64 first: torch.cat promotes the int pieces to it (exact for token ids)
        host = torch.cat([drafts_t[0].double(), res.accepted, res.token, spent]).cpu().numpy()
        t2 = timer.now()  # the round's one device → host copy is done
        x_host = host[:k_r].astype(np.int64)
        a_host = int(host[k_r])
        y_host = int(host[k_r + 1])
        spent_host = float(host[k_r + 2])
        emitted = [*x_host[:a_host].tolist(), y_host]
        m = min(len(emitted), config.max_new_tokens - start)
        for j, tok in enumerate(emitted[:m]):
            if tok in pair.eos_ids:
                m = j + 1
                stop = "eos"
                break
        truncated = m < len(emitted)
        if plog is not None:
            # A truncated round logs only its emitted drafts (no recovery/bonus row).
            plog.add(
                p[0], q[0], z[0], drafts_t[0], res, start, x_host, a_host, y_host,
                m if truncated else k_r, not truncated,
            )  # fmt: skip
        seq.extend(emitted[:m])
        a_logged = m if truncated else a_host
        spent_row = None if res.state is None else spent_host
        round_rows.append((len(round_rows), start, k_r, a_logged, m, t1 - t0, t2 - t1, spent_row))
        if stop == "eos" or truncated:
            break
        # --- roll both caches back to the emitted sequence (all but its last token)
        _crop(t_cache, len(seq) - 1)
        _crop(d_cache, len(seq) - 1)
    output_ids = seq[n_prompt:]
    positions = plog.columns() if plog is not None else {}
    return output_ids, stop, passes, positions, _rounds(round_rows)


def _host_token_stats(
    p: torch.Tensor,
    q: torch.Tensor | None,
    z: torch.Tensor,
    x: torch.Tensor,
    theta: float,
    extra: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``rules.token_stats`` of N rows ``[N, V]`` on the host, in one device → host copy.

    On CPU the rows go in chunks of about ``_CPU_CHUNK`` elements, so the full-size
    temporaries of each chunk stay in cache (about 1.5x faster at V = 4096); one call on a
    GPU. ``extra`` (any shape, exact in float64) travels in the same copy.

    Returns:
        ``[len(_HOST_STATS), N]`` float64 statistics in ``_HOST_STATS`` order, and the
        flattened ``extra`` (empty without it).
    """
    import torch

    from relaxspec_audit import rules

    n = p.shape[0]
    step = n if p.is_cuda else max(1, _CPU_CHUNK // p.shape[-1])
    parts = [
        rules.token_stats(p[i : i + step], None if q is None else q[i : i + step],
                          z[i : i + step], x[i : i + step], theta)
        for i in range(0, n, step)
    ]  # fmt: skip
    st = {c: torch.cat([part[c] for part in parts]) for c in _STAT_KEYS}  # each [N]
    floats = torch.stack([st[c] for c in _HOST_STATS[: -len(_INT_STATS)]])
    ints = torch.stack([st[c] for c in _INT_STATS])  # int64 (bool promoted)
    # float64 holds every token id and rank exactly
    pieces = [floats.double().reshape(-1), ints.reshape(-1)]
    if extra is not None:
        pieces.append(extra.reshape(-1))
    host = torch.cat(pieces).cpu().numpy()
    n_s = len(_HOST_STATS)
    return host[: n_s * n].reshape(n_s, n), host[n_s * n :]


def _pad_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` with its last row repeated along dim 0 up to ``n`` rows."""
    import torch

    return torch.cat([t, t[-1:].expand(n - t.shape[0], *t.shape[1:])])


class _RoundLog:
    """Position rows of one speculative request, computed off the per-round path.

    A round only hands over references to its device tensors (p, q, target logits, drafts,
    the rule's decisions) and a few host integers it already has. Every ``n_flush`` rounds
    (and at the end) one ``rules.token_stats`` over all pending drafts and emitted tokens
    and one ``E_S`` grid run (:func:`es_grid_topm`) go to the host; the host rows of every
    round are then built with numpy in one pass (:meth:`columns`). The rows equal a
    per-round computation's (each statistic is a reduction over one row of V), which
    tests/test_decoder.py checks against the rule's own full diagnostics.
    """

    def __init__(self, k: int, v: int, theta: float, grid: list[float], u_all: np.ndarray):
        self.k, self.theta, self.grid = k, theta, grid
        self.u_all = u_all  # [3, N+K+1] the request's uniforms (draft, accept, sample)
        self.n_flush = max(1, min(_FLUSH_MAX_ROUNDS, _FLUSH_FLOATS // ((3 * k + 2) * v)))
        self.pending: list[tuple] = []  # device tensors of rounds not yet flushed
        # start, a, y, n_draft_rows, emit, k_r per round
        self.meta: list[tuple[int, int, int, int, bool, int]] = []
        self.drafts: list[np.ndarray] = []  # [K] host draft tokens per round
        self.stats: list[np.ndarray] = []  # per flush [R, S] (layout: _flush)
        self.es: list[np.ndarray] = []  # per flush [R, K, G]

    def add(
        self,
        p: torch.Tensor,
        q: torch.Tensor,
        z: torch.Tensor,
        drafts: torch.Tensor,
        res: Any,
        start: int,
        x_host: np.ndarray,
        a: int,
        y: int,
        n_draft_rows: int,
        emit: bool,
    ) -> None:
        """Keep one round of ``k_r ≤ K`` drafts for the next flush.

        p, z are ``[k_r+1, V]``, q ``[k_r, V]``, drafts ``[k_r]``. A short round is padded
        to K by repeating its last row; the padding is never logged (rows ≤ k_r).
        """
        decisions = [res.diag[key][0] for key in _RULE_KEYS]  # each [k_r]
        k, k_r = self.k, drafts.shape[0]
        if k_r < k:
            p, z = _pad_rows(p, k + 1), _pad_rows(z, k + 1)
            q, drafts = _pad_rows(q, k), _pad_rows(drafts, k)
            decisions = [_pad_rows(d, k) for d in decisions]
            x_host = np.pad(x_host, (0, k - k_r), mode="edge")
        self.pending.append((p, q, z, drafts, res.token, decisions))
        self.meta.append((start, a, y, n_draft_rows, emit, k_r))
        self.drafts.append(x_host)
        if len(self.pending) >= self.n_flush:
            self._flush()

    def _flush(self) -> None:
        import torch

        if not self.pending:
            return
        k, pend = self.k, self.pending
        n = len(pend)
        a = [m[1] for m in self.meta[-n:]]
        # Rows: the R·K drafts, then the R emitted tokens; one copy per tensor (a bonus
        # row's q is a stand-in, ignored on the host).
        emit = list(zip(pend, a, strict=True))
        p = torch.cat([r[0][:k] for r in pend] + [r[0][ai : ai + 1] for r, ai in emit])
        q = torch.cat([r[1] for r in pend] + [r[1][min(ai, k - 1)][None] for r, ai in emit])
        z = torch.cat([r[2][:k] for r in pend] + [r[2][ai : ai + 1] for r, ai in emit])
        x = torch.cat([r[3] for r in pend] + [r[4] for r in pend])  # [R·K + R]
        decisions = torch.stack([d for r in self.pending for d in r[5]])  # [3R, K] int64
        st_h, dec = _host_token_stats(p, q, z, x, self.theta, extra=decisions)
        n_s, n_pos = len(_HOST_STATS), n * k
        dec_h = dec.reshape(n, 3, k)
        self.stats.append(
            np.concatenate(
                [
                    st_h[:, :n_pos].reshape(n_s, n, k).transpose(1, 0, 2).reshape(n, -1),
                    dec_h.reshape(n, -1),
                    st_h[:, n_pos:].T,
                ],
                1,
            )
        )  # [R, (S + 3)·K + S]: draft stats, decisions, emitted-token stats
        es = es_grid_topm(p[: n * k], q[: n * k], self.grid)  # [R·K, G]
        self.es.append(es.reshape(n, k, -1))
        self.pending.clear()

    def columns(self) -> dict[str, Any]:
        """Columns of the positions table: per round its draft rows, then recovery/bonus."""
        from relaxspec_audit.rules import Cause

        self._flush()
        if not self.meta:
            return {}
        k, n_s = self.k, len(_HOST_STATS)
        stats = np.concatenate(self.stats)  # [R, S]
        es = np.concatenate(self.es)  # [R, K, G]
        n_r = stats.shape[0]
        start, a, y, n_rows, emit, k_r = (np.array(c) for c in zip(*self.meta, strict=True))
        # Slots [R, K+1]: K draft rows, then the emitted row; `keep` drops unlogged slots.
        draft_part = stats[:, : (n_s + 3) * k].reshape(n_r, n_s + 3, k)
        emit_part = stats[:, (n_s + 3) * k :]  # [R, n_s]
        keep = np.concatenate([np.arange(k) < n_rows[:, None], emit[:, None]], 1)
        bonus = a == k_r  # the whole (possibly short) block accepted
        cols: dict[str, Any] = {}
        for i, name in enumerate(_HOST_STATS):
            e = emit_part[:, i].copy()
            if name in ("q", "entropy_q", "tv_pq"):
                e[bonus] = math.nan  # no draft distribution at position K+1
            cols[name] = np.concatenate([draft_part[:, i], e[:, None]], 1)
        for j, name in enumerate(_RULE_KEYS):
            e = np.full((n_r, 1), math.nan)
            if name == "cause":
                e[:, 0] = np.where(bonus, int(Cause.BONUS), int(Cause.RECOVERY))
            cols[name] = np.concatenate([draft_part[:, n_s + j], e], 1)
        kind = np.full((n_r, k + 1), "draft", dtype=object)
        kind[:, k] = np.where(bonus, "bonus", "recovery")
        pos = np.concatenate([np.broadcast_to(np.arange(k), (n_r, k)), a[:, None]], 1)
        abs_draft = start[:, None] + np.arange(k)  # [R, K]
        u = np.concatenate([self.u_all[1][abs_draft], self.u_all[2][start + a][:, None]], 1)
        es_emit = es[np.arange(n_r), np.minimum(a, k - 1)]  # [R, G]
        es_emit[bonus] = math.nan
        cols["es"] = np.concatenate([es, es_emit[:, None]], 1)  # [R, K+1, G]
        cols["token"] = np.concatenate([np.stack(self.drafts), y[:, None]], 1)
        cols["pos"] = pos
        cols["u"] = u
        cols["round"] = np.broadcast_to(np.arange(n_r)[:, None], (n_r, k + 1))
        cols["abs_pos"] = start[:, None] + pos
        out = {name: col[keep] for name, col in cols.items()}
        out["kind"] = kind[keep].tolist()
        return _position_columns(out, len(self.grid))


def _position_columns(cols: dict[str, Any], n_grid: int) -> dict[str, Any]:
    """The positions table's column types from numeric arrays (NaN → null where nullable)."""
    from relaxspec_audit.rules import Cause

    out: dict[str, Any] = {}
    for name, values in cols.items():
        if name == "kind":
            out[name] = values
        elif name == "cause":
            out[name] = [Cause(int(c)).name.lower() for c in values]
        elif name in _BOOL_COLS:
            out[name] = [None if math.isnan(x) else bool(x) for x in values]
        elif name in _INT_COLS or name in ("token", "round", "pos", "abs_pos"):
            out[name] = values.astype(np.int64)
        elif name == "es":
            es = values.reshape(-1, n_grid).astype(np.float32)
            out[name] = [None if np.isnan(r).any() else r.tolist() for r in es]
        else:
            f = values.astype(np.float32)
            out[name] = (
                [None if math.isnan(x) else x for x in f.tolist()] if np.isnan(f).any() else f
            )
    return out


def _rounds(rows: list[tuple]) -> dict[str, Any]:
    names = ("round", "start_pos", "k", "accepted", "emitted", "draft_s", "verify_s", "spent")
    return {name: [r[i] for r in rows] for i, name in enumerate(names)}


def _decode_target_only(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    timing: bool,
) -> tuple[list[int], str, int, dict[str, Any], dict[str, Any]]:
    """Autoregressive decoding with the target alone (the speed baseline, greedy reference).

    Each token is one target pass, logged as a round with K = 0 whose single position is a
    ``bonus`` row (the token is sampled from p, like a bonus after an empty block). The
    token is read on the host every step (for the EOS check), logging or not.
    """
    import torch

    from relaxspec_audit import rules

    dev, v = pair.device, pair.vocab_size
    key = rng.request_key(request_id)
    timer = _Timer(dev, timing)
    log = config.log_positions
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=dev)
    cache = _new_cache(pair.target)
    z_next = _prefill(pair.target, prompt, cache, v)  # [1, V]: the first token's logits
    feed = prompt[:, -1:]  # replaced by each emitted token; the prefill covered the prompt
    n_new = config.max_new_tokens
    u_all = rng.uniforms(config.seed, key, np.arange(n_new, dtype=np.int64), rng.Purpose.SAMPLE)
    u_dev = torch.from_numpy(u_all).to(dev)  # [N], one transfer for the whole request
    output: list[int] = []
    round_rows: list[tuple] = []
    stop = "length"
    n_grid = len(config.theta_grid)
    # Logging batched as in _RoundLog: keep each token's logits (and p when sampling) and
    # compute token_stats for many tokens at once, one host copy per batch.
    n_flush = max(1, min(256, _FLUSH_FLOATS // (2 * v)))
    pending: list[tuple] = []  # (z [1, V], p [1, V] or None, y [1]) not yet flushed
    stats: list[np.ndarray] = []  # [S, n] per flush, _HOST_STATS order

    def flush() -> None:
        if pending:
            z_b = torch.cat([e[0] for e in pending])  # [n, V]
            greedy_p = config.greedy  # greedy mode logs softmax(z) at temperature 1
            p_b = transform_logits(z_b, 0.0) if greedy_p else torch.cat([e[1] for e in pending])
            y_b = torch.cat([e[2] for e in pending])
            stats.append(_host_token_stats(p_b, None, z_b, y_b, rules.DEFAULT_THETA)[0])
            pending.clear()

    for i in range(n_new):
        t0 = timer.now()
        if z_next is not None:
            z, z_next = z_next.float(), None
        else:
            z = _forward(pair.target, feed, cache, keep=1)[:, -1, :v].float()  # [1, V]
        p = None
        if config.greedy:
            y = z.argmax(-1)  # [1]
        else:
            p = transform_logits(z, config.temperature, config.top_k, config.top_p)
            y = rng.sample_icdf(p, u_dev[i : i + 1])  # [1]
        tok = int(y.item())
        if log:
            pending.append((z, p, y))
            if len(pending) >= n_flush:
                flush()
        t1 = timer.now()
        round_rows.append((i, i, 0, 0, 1, 0.0, t1 - t0, None))
        output.append(tok)
        if tok in pair.eos_ids:
            stop = "eos"
            break
        feed = y.view(1, 1)
    positions: dict[str, Any] = {}
    if log:
        flush()
        n = len(output)
        st = np.concatenate(stats, 1)  # [S, n]; q, entropy_q, tv_pq are NaN (no draft)
        cols: dict[str, Any] = {name: st[j] for j, name in enumerate(_HOST_STATS)}
        cols.update(
            passed_ratio=np.full(n, math.nan),
            accepted=np.full(n, math.nan),
            cause=np.full(n, float(rules.Cause.BONUS)),
            kind=["bonus"] * n,
            token=np.array(output, dtype=np.int64),
            pos=np.zeros(n, dtype=np.int64),
            u=u_all[:n],
            es=np.full((n, n_grid), math.nan),
            round=np.arange(n),
            abs_pos=np.arange(n),
        )
        positions = _position_columns(cols, n_grid)
    return output, stop, len(output), positions, _rounds(round_rows)


# ----------------------------------------------------------------------------- collect


def encode_prompt(pair: Pair, prompt: str) -> list[int]:
    """Token ids of a prompt (``tokenizer(prompt)``; the BOS token if that is empty)."""
    if pair.tokenizer is None:
        raise DecodeError("the pair has no tokenizer; pass prompt token ids")
    ids = list(pair.tokenizer(prompt)["input_ids"])
    if not ids and pair.tokenizer.bos_token_id is not None:
        ids = [int(pair.tokenizer.bos_token_id)]
    return ids


def collect(
    config: RunConfig,
    out: str | Path,
    resume: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
    pair: Pair | None = None,
    chunk_size: int = 16,
) -> Path:
    """Decode every item of the config's task and write the run folder under ``out``.

    Finished requests of an existing run folder are skipped (``resume``); the task scorer
    grades each completion. The request id is the task item's id, so runs of different
    rules on one seed share each request's random stream (SPEC §4).

    Args:
        config: the run configuration (validated here).
        out: parent folder of runs (``runs/``).
        resume: keep and skip finished requests of an earlier, interrupted run.
        progress: called after each request (and once at the start) with a dict of
            ``done``, ``total``, ``tokens``, ``passes``, ``accepted``, ``drafted``, ``wall_s``.
        pair: an already loaded pair (default: :func:`load_pair` of the config's models).
        chunk_size: finished requests per committed Parquet part.

    Returns:
        The run folder.
    """
    from relaxspec_audit import tasks
    from relaxspec_audit.logs import RunWriter

    config.validate()
    task = tasks.load_task(config.task, split=config.split, limit=config.limit)
    if pair is None:
        draft = None if config.rule == TARGET_ONLY else config.draft
        pair = load_pair(config.target, draft, config.device, config.dtype)
    run_dir = config.run_dir(out)
    manifest = {
        "config": config.to_dict(),
        "run_id": config.run_id(),
        "theta_grid": list(config.theta_grid),
        "models": pair.info,
        "task": {"name": task.name, "n_items": len(task.items), "scorer": task.scorer_name},
        "eos_ids": sorted(pair.eos_ids),
    }
    totals = {"done": 0, "total": len(task.items), "tokens": 0, "passes": 0}
    totals.update(accepted=0, drafted=0, wall_s=0.0, skipped=0)
    with RunWriter(run_dir, manifest, resume=resume, chunk_size=chunk_size) as writer:
        todo = [item for item in task.items if item.id not in writer.finished]
        totals["skipped"] = totals["done"] = len(task.items) - len(todo)
        if progress is not None:
            progress(dict(totals))
        for item in todo:
            ids = encode_prompt(pair, item.prompt)
            rows = decode_request(pair, ids, config, item.id)
            text = pair.tokenizer.decode(rows.request["output_ids"], skip_special_tokens=True)
            rows.request.update(
                item_id=item.id,
                task=task.name,
                split=item.split,
                text=text,
                score=task.score(item, text),
            )
            writer.add(rows)
            totals["done"] += 1
            totals["tokens"] += rows.request["n_tokens"]
            totals["passes"] += rows.request["target_passes"]
            totals["accepted"] += int(sum(rows.rounds["accepted"]))
            totals["drafted"] += int(sum(rows.rounds["k"]))
            totals["wall_s"] += rows.request["wall_s"]
            if progress is not None:
                progress(dict(totals))
    return run_dir


def describe(pair: Pair) -> str:
    """One JSON line describing a pair (for logs and benchmark headers)."""
    return json.dumps({k: pair.info[k] for k in ("vocab_size", "device", "dtype")})
