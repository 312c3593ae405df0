"""The decode loops: speculative rounds with KV-cache rollback, and the target-only baseline.

One round (THEORY §1): the draft proposes ``K`` tokens autoregressively with its KV cache;
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

Randomness is coupled (THEORY §4): every draw is ``rng.uniforms(seed, request_key, abs_pos,
purpose)`` used through the inverse CDF, so runs of different rules with one seed share
their stream position by position. Every uniform a request can use is drawn on the host
with numpy (``collect.sampling``) and copied to the device in one transfer per request.

Every round copies to the host only what decoding needs (the drafts, the accepted length,
the emitted token, the ASD ledger: one small copy). The rule runs with
``Block(diagnostics=False)``, computing only what its decision needs. With logging on, the
round hands references to p, q, the target logits and the rule's decisions
(``roundlog.RoundTensors``) and the host values it read (``roundlog.RoundOutcome``) to
``roundlog._RoundLog``, which computes the per-position statistics (``rules.token_stats``
of drafts and emitted tokens, ``E_S`` on the θ grid) batched over up to 64 rounds, copies
them to the host in one transfer per batch and builds the rows with numpy at the end of
the request. So the logging cost is a few batched kernels per request, not per round.

A round that would overshoot ``max_new_tokens`` or runs past an EOS is truncated: only
the emitted tokens are kept; the draft rows after the cut and the recovery/bonus row of
that round are not logged (they were never emitted).

torch and transformers are imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig
from relaxspec_audit.collect.kvcache import _crop, _forward, _new_cache, _prefill
from relaxspec_audit.collect.logs import RequestRows, output_sha256
from relaxspec_audit.collect.pair import DecodeError, Pair, check_prompt_fits
from relaxspec_audit.collect.roundlog import (
    RoundOutcome,
    RoundRecord,
    RoundTensors,
    _RoundLog,
    _rounds,
    _TokenLog,
)
from relaxspec_audit.collect.sampling import _host_uniforms, transform_logits
from relaxspec_audit.collect.stops import StopStrings
from relaxspec_audit.verify import rng
from relaxspec_audit.verify.block import Block

if TYPE_CHECKING:
    import torch

# Stop drafting at a draft EOS (nothing after it can be emitted). Off only in the test that
# checks outputs are unchanged by it.
_STOP_DRAFT_AT_EOS = True


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


def _eos_check_per_step(device: torch.device) -> bool:
    """Read each draft on the host to stop at a draft EOS (else once per round)?

    A host read is free on CPU; on CUDA it would stall the queue of kernel launches at every
    draft step, so there the drafts are read once per round (the block still ends at the
    first EOS: the logs are the same, only the draft passes after an EOS are not saved).
    """
    return device.type != "cuda"


def guard_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with non-finite entries zeroed, and which rows had one: ``([..., V], [...])``.

    NaN or ±inf logits make p or q non-finite, and sampling from them picks no token
    (``sample_icdf`` returns −1, an out-of-range index that crashes a CPU run and kills a
    CUDA context). The zeroed copy keeps the round's kernels in range until its one host
    copy reads the flag and the round is refused (:func:`nonfinite_error`); finite logits
    pass through unchanged, bit for bit.

    A row's sum is finite iff every entry is (NaN and ±inf propagate; logits are far from
    float32's overflow), so the flag costs one reduction; the copy, one pass.
    """
    import torch

    bad = ~torch.isfinite(logits.sum(-1))  # [...]
    return logits.nan_to_num(0.0, 0.0, 0.0), bad


def nonfinite_error(
    request_id: str, start: int, n_prompt: int, draft_bad: Any, target_bad: Any
) -> DecodeError:
    """The error for a round whose draft or target logits were not finite.

    Args:
        request_id: the request.
        start: the output position of the round's first token.
        n_prompt: the prompt's length (the sequence position is ``n_prompt + output pos``).
        draft_bad: ``[k]`` flags of the draft steps (None for target-only decoding).
        target_bad: ``[k + 1]`` flags of the target's rows.
    """
    parts = []
    for role, bad in (("draft", draft_bad), ("target", target_bad)):
        at = np.flatnonzero(np.asarray(bad, dtype=bool)) if bad is not None else []
        if len(at):
            pos = start + int(at[0])
            parts.append(f"{role} model at output position {pos} (sequence position "
                         f"{n_prompt + pos})")  # fmt: skip
    return DecodeError(
        f"request {request_id}: non-finite logits (NaN or inf) from the "
        + " and from the ".join(parts)
        + "; nothing of this request was written (check the weights and the dtype)"
    )


def cut_emitted(
    emitted: list[int],
    m: int,
    stop: str,
    eos_ids: frozenset[int],
    stops: StopStrings | None,
    output: list[int],
) -> tuple[int, str]:
    """How many of a round's ``m`` emittable tokens are kept, and the request's stop.

    The first EOS ends the request (kept, ``"eos"``); else the first token whose text
    completes a task stop string (kept, ``"stop"``); else all ``m`` and ``stop`` unchanged.
    ``output`` is what the request emitted before this round.
    """
    for j, tok in enumerate(emitted[:m]):
        if tok in eos_ids:
            m, stop = j + 1, "eos"
            break
    if stops is not None:
        c = stops.cut([*output, *emitted[:m]], m)
        if c is not None and (c < m or stop != "eos"):
            m, stop = c, "stop"
    return m, stop


def decode_request(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    *,
    timing: bool = True,
    rule_fn: Callable[..., Any] | None = None,
    stops: StopStrings | None = None,
) -> RequestRows:
    """Decode one request under ``config.rule`` and return its log rows.

    Args:
        pair: the loaded pair (:func:`load_pair` / :func:`make_pair`).
        prompt_ids: the prompt's token ids (at least one).
        config: the run configuration (rule, params, K, sampling, seed, ...).
        request_id: the request key; it keys the coupled random stream (THEORY §4).
        timing: measure ``draft_s`` / ``verify_s`` (synchronises CUDA when on).
        rule_fn: replace the registered rule function (tests of deliberately broken rules).
        stops: the task's decode-time stop strings (:mod:`~relaxspec_audit.collect.stops`).

    Returns:
        ``positions``, ``rounds`` and the ``requests`` row (without item, task, split,
        text and score, which :func:`collect` adds).
    """
    import torch

    if not prompt_ids:
        raise DecodeError(f"request {request_id}: empty prompt (no token ids)")
    k = 0 if config.rule == TARGET_ONLY else config.k
    check_prompt_fits(pair, request_id, len(prompt_ids), config.max_new_tokens + k + 1)
    t_start = time.perf_counter()
    with torch.inference_mode():
        if config.rule == TARGET_ONLY:
            out = _decode_target_only(pair, prompt_ids, config, request_id, timing, stops)
        else:
            if pair.draft is None:
                raise DecodeError(f"rule {config.rule!r} needs a draft model; the pair has none")
            out = _decode_speculative(pair, prompt_ids, config, request_id, timing, rule_fn, stops)
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


def _decode_speculative(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    timing: bool,
    rule_fn: Callable[..., Any] | None,
    stops: StopStrings | None = None,
) -> tuple[list[int], str, int, dict[str, Any], dict[str, Any]]:
    import torch

    dev, v, k = pair.device, pair.vocab_size, config.k
    spec = config.spec
    fn = rule_fn or spec.fn
    params = config.params
    greedy = config.greedy
    theta = spec.nucleus_theta(params)  # in_nucleus is logged at the run's nucleus θ
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
    round_rows: list[RoundRecord] = []
    stop = "length"
    passes = 0
    # Every uniform the request can use (THEORY §4: keyed by absolute position), drawn on the
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
        drafts, q_rows, d_bad = [], [], []
        for i in range(k_cap):
            if d_next is not None:  # first round: the prefill already predicted x_1
                logits, d_next = d_next, None
            else:
                logits = _forward(pair.draft, feed, d_cache, keep=1)[:, -1, :v]  # [1, V]
            logits, bad = guard_logits(logits)  # read with the round's one host copy
            d_bad.append(bad)
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
        d_bad_t = torch.stack(d_bad[:k_r], 1)  # [1, k_r]
        t1 = timer.now()
        # --- verify: what the target cache lacks (the last emitted token; the whole prompt
        # in round 0) + the k_r drafts in ONE target pass; keep the last k_r + 1 rows.
        missing = torch.tensor([seq[t_cache.get_seq_length() :]], dtype=torch.long, device=dev)
        t_in = torch.cat([missing, drafts_t], 1)  # [1, n + k_r]
        z = _forward(pair.target, t_in, t_cache, keep=k_r + 1)[..., :v].float()  # [1, k_r+1, V]
        z, t_bad = guard_logits(z)  # [1, k_r+1, V], [1, k_r+1]
        bad_any = torch.cat([d_bad_t[0], t_bad[0]]).any().view(1)  # [1]
        passes += 1
        p = transform_logits(z, config.temperature, config.top_k, config.top_p)  # [1, k_r+1, V]
        block = Block(
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
        host = (
            torch.cat([drafts_t[0].double(), res.accepted, res.token, spent, bad_any.double()])
            .cpu()
            .numpy()
        )
        t2 = timer.now()  # the round's one device → host copy is done
        if host[k_r + 3]:  # before anything of the round is emitted or logged
            raise nonfinite_error(request_id, start, n_prompt, d_bad_t[0].cpu(), t_bad[0].cpu())
        x_host = host[:k_r].astype(np.int64)
        a_host = int(host[k_r])
        y_host = int(host[k_r + 1])
        spent_host = float(host[k_r + 2])
        emitted = [*x_host[:a_host].tolist(), y_host]
        m = min(len(emitted), config.max_new_tokens - start)
        m, stop = cut_emitted(emitted, m, stop, pair.eos_ids, stops, seq[n_prompt:])
        truncated = m < len(emitted)
        if plog is not None:
            # A truncated round logs only its emitted drafts (no recovery/bonus row).
            plog.add(
                RoundTensors.of(p, q, z, drafts_t, res),
                RoundOutcome(start, x_host, a_host, y_host, m if truncated else k_r, not truncated),
            )
        seq.extend(emitted[:m])
        a_logged = m if truncated else a_host
        spent_row = None if res.state is None else spent_host
        round_rows.append(
            RoundRecord(len(round_rows), start, k_r, a_logged, m, t1 - t0, t2 - t1, spent_row)
        )
        if stop != "length" or truncated:
            break
        # --- roll both caches back to the emitted sequence (all but its last token)
        _crop(t_cache, len(seq) - 1)
        _crop(d_cache, len(seq) - 1)
    output_ids = seq[n_prompt:]
    positions = plog.columns() if plog is not None else {}
    return output_ids, stop, passes, positions, _rounds(round_rows)


def _decode_target_only(
    pair: Pair,
    prompt_ids: list[int],
    config: RunConfig,
    request_id: str,
    timing: bool,
    stops: StopStrings | None = None,
) -> tuple[list[int], str, int, dict[str, Any], dict[str, Any]]:
    """Autoregressive decoding with the target alone (the speed baseline, greedy reference).

    Each token is one target pass, logged as a round with K = 0 whose single position is a
    ``bonus`` row (the token is sampled from p, like a bonus after an empty block). The
    token is read on the host every step (for the EOS check), logging or not.
    """
    import torch

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
    round_rows: list[RoundRecord] = []
    stop = "length"
    # Logging batched as in _RoundLog (one host copy per batch of tokens).
    tlog = _TokenLog(v, config.greedy, len(config.theta_grid)) if log else None
    for i in range(n_new):
        t0 = timer.now()
        if z_next is not None:
            z, z_next = z_next.float(), None
        else:
            z = _forward(pair.target, feed, cache, keep=1)[:, -1, :v].float()  # [1, V]
        z, bad = guard_logits(z)  # [1, V], [1]
        p = None
        if config.greedy:
            y = z.argmax(-1)  # [1]
        else:
            p = transform_logits(z, config.temperature, config.top_k, config.top_p)
            y = rng.sample_icdf(p, u_dev[i : i + 1])  # [1]
        tok, is_bad = torch.cat([y, bad.long()]).tolist()  # the step's one host read
        if is_bad:
            raise nonfinite_error(request_id, i, len(prompt_ids), None, [True])
        if tlog is not None:
            tlog.add(z, p, y)
        t1 = timer.now()
        round_rows.append(RoundRecord(i, i, 0, 0, 1, 0.0, t1 - t0, None))
        output.append(tok)
        _, stop = cut_emitted([tok], 1, stop, pair.eos_ids, stops, output[:-1])
        if stop != "length":
            break
        feed = y.view(1, 1)
    positions = tlog.columns(output, u_all) if tlog is not None else {}
    return output, stop, len(output), positions, _rounds(round_rows)
