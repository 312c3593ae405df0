"""Build (train) the embedded target/draft model pair under ``data/models/<name>/``.

Run ``python -m relaxspec_audit.models.zoo --out data/models/arith``. It

1. generates a training corpus from the bundled task generators of :mod:`tasks`
   (``arith``, ``sort``, ``story``), dropping every prompt of the bundled task items so
   the evaluation is held out;
2. trains a byte-level BPE tokenizer on it (digits split one per token, so numbers are
   spelled digit by digit) and wraps it as a ``PreTrainedTokenizerFast``;
3. trains two Llama causal LMs on the same data: a target, and a much smaller draft
   trained for fewer steps, so the draft is fluent but clearly worse;
4. saves each as ``{target,draft}/`` (safetensors, config, generation config, tokenizer),
   loadable offline with ``AutoModelForCausalLM.from_pretrained`` and
   ``AutoTokenizer.from_pretrained``;
5. measures held-out accuracy of both models (greedy) and the ``exact``-rule acceptance
   at temperature 1 (``α = Σ_x min(p, q)`` per position, THEORY §2.1, averaged over
   target-sampled completions), and writes ``MODEL_CARD.md`` and ``metrics.json``.

Everything is deterministic in ``--seed`` on a fixed thread count (2).

Tokenizer contract for decoders: ``tokenizer(prompt)`` adds no special tokens (there is
no post-processor; ``<|bos|>`` exists but is never used in training), ``eos_token_id``
is set in the tokenizer, the model config and the generation config, and every training
completion ends with eos, so decoding stops right after the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from relaxspec_audit import tasks
from relaxspec_audit.verify.theory import expected_tokens_per_pass

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"
# Completions of the bundled tasks fit in this many tokens (story is the longest).
MAX_NEW_TOKENS = 48


@dataclass(frozen=True)
class ModelSpec:
    """Shape and training length of one Llama model of the pair."""

    hidden_size: int  # model width
    num_layers: int  # transformer blocks
    num_heads: int  # attention heads (no GQA: kv heads = heads)
    intermediate_size: int  # SwiGLU width
    steps: int  # optimizer steps
    lr: float  # peak AdamW learning rate (linear warm-up, cosine decay)


@dataclass(frozen=True)
class ZooConfig:
    """Everything that determines the trained pair (saved into ``metrics.json``)."""

    seed: int = 0  # seeds data generation, init and batch order
    vocab_size: int = 512  # BPE vocabulary incl. the 256 byte symbols and 3 specials
    n_arith: int = 60_000  # training examples per task (bundled items excluded)
    n_sort: int = 12_000
    n_story: int = 20_000
    # Batch share of arith/sort/story. Sorting is easy for a transformer: a small share
    # keeps both models from mastering it (the draft must stay clearly worse).
    mix: tuple[float, float, float] = (0.67, 0.08, 0.25)
    batch_size: int = 32
    threads: int = 2
    # On a CPU at these sizes a call's cost is mostly per-layer overhead, not width: six
    # target blocks against two draft blocks is what makes a draft call cheap enough for
    # speculation to pay. Two blocks is the least that can copy the operands from the
    # prompt (an induction head needs two); one block could not (3% accuracy).
    target: ModelSpec = ModelSpec(128, 6, 4, 384, 2500, 3e-3)
    draft: ModelSpec = ModelSpec(64, 2, 2, 192, 2200, 3e-3)
    # The phrasing each model's corpus is drawn with (tasks.bundled.ArithStyle).
    target_style: tasks.ArithStyle = tasks.TARGET_STYLE
    draft_style: tasks.ArithStyle = tasks.DRAFT_STYLE


# ------------------------------------------------------------------------- data


def training_examples(cfg: ZooConfig, role: str = "target") -> dict[str, list[tuple[str, str]]]:
    """Generate ``(prompt, completion)`` pairs per task, without the bundled prompts.

    Args:
        cfg: Sizes and seed.
        role: ``target`` or ``draft``: whose arithmetic phrasing (``cfg.*_style``) the
            corpus uses; the problems come from the same seeded stream.

    Returns:
        ``{"arith": [...], "sort": [...], "story": [...]}``.
    """
    held_out = tasks.held_out_prompts()
    style = {"target": cfg.target_style, "draft": cfg.draft_style}[role]
    rng = random.Random(cfg.seed * 1_000_003 + 17)
    out: dict[str, list[tuple[str, str]]] = {"arith": [], "sort": [], "story": []}
    makers = {
        "arith": (lambda r: tasks.arith_example(r, style), cfg.n_arith),
        "sort": (tasks.sort_example, cfg.n_sort),
        "story": (tasks.story_example, cfg.n_story),
    }
    for name, (make, n) in makers.items():
        while len(out[name]) < n:
            example = make(rng)
            prompt, completion = example[0], example[1]
            # Story openings repeat by design (a small grammar); their continuations
            # are open-ended, so only scored tasks must keep evaluation prompts out.
            if name != "story" and prompt in held_out:
                continue
            out[name].append((prompt, completion))
    return out


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer with single-digit tokens.

    Args:
        texts: Training text.
        vocab_size: Final vocabulary size (256 byte symbols + specials + merges).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with bos/eos/pad set and no
        special tokens added on encode.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        model_max_length=256,
    )


def encode_examples(
    tokenizer: Any, examples: list[tuple[str, str]], loss_on_prompt: bool
) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels of ``prompt + completion + eos``.

    The prompt and completion are encoded separately and concatenated, which is what a
    decoder does (it encodes the prompt, then generates), so training sees exactly the
    token boundary seen at inference.

    Args:
        tokenizer: The pair's tokenizer.
        examples: ``(prompt, completion)`` pairs.
        loss_on_prompt: Train on the prompt tokens too (story openings are text of the
            same grammar; arithmetic operands are random, so no loss there).

    Returns:
        ``(input_ids, labels)`` per example; labels are -100 where there is no loss.
    """
    prompts = tokenizer([p for p, _ in examples])["input_ids"]
    completions = tokenizer([c for _, c in examples])["input_ids"]
    out = []
    for p_ids, c_ids in zip(prompts, completions, strict=True):
        ids = [*p_ids, *c_ids, tokenizer.eos_token_id]
        labels = list(ids) if loss_on_prompt else [-100] * len(p_ids) + ids[len(p_ids) :]
        out.append((ids, labels))
    return out


# ------------------------------------------------------------------------ models


def make_model(spec: ModelSpec, tokenizer: Any, seed: int) -> Any:
    """A freshly initialised Llama causal LM of the given shape."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
    )
    return model


def train_model(
    model: Any,
    data: dict[str, list[tuple[list[int], list[int]]]],
    spec: ModelSpec,
    cfg: ZooConfig,
    seed: int,
    log: Any = None,
) -> dict[str, Any]:
    """Train ``model`` in place on a task mix; returns steps, final loss and seconds.

    Args:
        model: The model to train.
        data: Encoded examples per task (``encode_examples``).
        spec: Steps and learning rate.
        cfg: Batch size and task mix.
        seed: Seeds the batch order.
        log: Optional ``callable(str)`` for progress lines.

    Returns:
        ``{"steps", "final_loss", "train_s", "train_cpu_s"}``.
    """
    import math

    import torch

    names = list(data)
    weights = torch.tensor(cfg.mix, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, spec.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return spec.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, spec.steps - warmup)
        return spec.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    start, cpu_start = time.perf_counter(), time.process_time()
    ema = None
    for step in range(spec.steps):
        task_idx = torch.multinomial(weights, cfg.batch_size, replacement=True, generator=gen)
        batch = []
        for t in task_idx.tolist():
            pool = data[names[t]]
            batch.append(pool[int(torch.randint(len(pool), (1,), generator=gen))])
        width = max(len(ids) for ids, _ in batch)
        # Right padding with no attention mask is exact under causal attention: real
        # tokens never attend to the pads after them, and pads carry no loss.
        input_ids = torch.full((len(batch), width), 0, dtype=torch.long)  # [B, T]
        labels = torch.full((len(batch), width), -100, dtype=torch.long)  # [B, T]
        for row, (ids, lab) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=input_ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if log is not None and (step % 200 == 0 or step == spec.steps - 1):
            log(f"step {step:5d}  loss {ema:.4f}  {time.perf_counter() - start:7.1f}s")
    model.eval()
    return {
        "steps": spec.steps,
        "final_loss": ema,
        "train_s": time.perf_counter() - start,
        # CPU seconds of this process: on a shared machine wall time mostly measures
        # the neighbours, CPU time measures the work.
        "train_cpu_s": time.process_time() - cpu_start,
    }


def count_params(model: Any) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------- measurement


def greedy_complete(
    model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 48, temperature: float = 0.0
) -> str:
    """Completion of one prompt, stopping at eos; returns the decoded new text.

    Greedy at ``temperature`` 0, else sampled at that temperature (no top-k/top-p) from
    torch's global generator (seed it first for a reproducible draw).
    """
    import torch

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]  # [1, T]
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **(sampling if temperature > 0 else {"do_sample": False}),
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def item_scores(
    model: Any,
    tokenizer: Any,
    task: tasks.Task,
    limit: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
) -> dict[str, float | None]:
    """Score of ``model`` on each item (first ``limit``), keyed by item id.

    Greedy at ``temperature`` 0; else one sample per item at that temperature, seeded
    by ``seed`` once for the whole pass.
    """
    import torch

    items = task.items if limit is None else task.items[:limit]
    torch.manual_seed(seed)
    return {
        item.id: task.score(
            item, greedy_complete(model, tokenizer, item.prompt, temperature=temperature)
        )
        for item in items
    }


def accuracy(model: Any, tokenizer: Any, task: tasks.Task, limit: int | None = None) -> float:
    """Mean greedy score of ``model`` over the task's items (first ``limit``)."""
    scores = [s for s in item_scores(model, tokenizer, task, limit).values() if s is not None]
    return sum(scores) / len(scores)


def acceptance_rate(
    target: Any,
    draft: Any,
    tokenizer: Any,
    prompts: list[str],
    seed: int = 0,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> dict[str, float]:
    """Per-position ``exact``-rule acceptance at temperature 1 (THEORY §2.1).

    Samples a completion of each prompt from the target (temperature 1, no top-k/top-p),
    then scores it with both models in one forward pass each and averages
    ``α = Σ_x min(p(x), q(x))`` over the completion positions, including the one that
    predicts eos. This is the acceptance probability of each draft position of a
    speculative decoder given the prefix, without needing the decoder itself.

    Args:
        target: Target model (``p``).
        draft: Draft model (``q``).
        tokenizer: Shared tokenizer.
        prompts: Prompts to complete.
        seed: Seeds the target's sampling.
        max_new_tokens: Completion length cap.

    Returns:
        ``{"alpha": mean α over positions, "positions": count, "mean_tv": mean TV(p, q)}``.
    """
    import torch

    torch.manual_seed(seed)
    total, n = 0.0, 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]  # [1, T]
        with torch.no_grad():
            seq = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )  # [1, T + N]
            start = ids.shape[1] - 1  # row predicting the first completion token
            end = seq.shape[1] - 1  # the last emitted token is predicted by row end-1
            p = torch.softmax(target(seq).logits[0, start:end].float(), dim=-1)  # [N, V]
            q = torch.softmax(draft(seq).logits[0, start:end].float(), dim=-1)  # [N, V]
        alpha = torch.minimum(p, q).sum(-1)  # [N]
        total += alpha.sum().item()
        n += alpha.numel()
    return {"alpha": total / n, "positions": n, "mean_tv": 1 - total / n}


# A small sample that tests re-measure quickly: greedy on the first CHECK_ITEMS items
# of each scored task, acceptance on the first CHECK_PROMPTS prompts of each task.
CHECK_ITEMS = 30
CHECK_PROMPTS = 8


def measure(target: Any, draft: Any, tokenizer: Any, seed: int = 0) -> dict[str, Any]:
    """Held-out accuracy of both models on the scored bundled tasks, and acceptance.

    Accuracy is greedy over every bundled item of ``arith`` and ``sort`` (both splits;
    none of these prompts is in the training data); the ids of the items each model
    gets right are kept, so a test can re-check any subset exactly; ``accuracy_t1`` is
    the same with one sample per item at temperature 1. Acceptance is
    :func:`acceptance_rate` over the prompts of ``arith``, ``sort`` and ``story``, per
    task and pooled over positions (``all``), plus the ``check`` sample.

    Args:
        target: Target model.
        draft: Draft model.
        tokenizer: Shared tokenizer.
        seed: Seed of the target's sampling.

    Returns:
        ``{"accuracy": {task: {...}}, "accuracy_t1": {task: {...}},
        "acceptance": {task: {...}}, "check": {...}}``.
    """
    result: dict[str, Any] = {"accuracy": {}, "accuracy_t1": {}, "acceptance": {}, "check": {}}
    for name in ("arith", "sort"):
        task = tasks.load_task(name)
        row: dict[str, Any] = {"n": len(task.items)}
        for role, model in (("target", target), ("draft", draft)):
            scores = item_scores(model, tokenizer, task)
            row[role] = sum(scores.values()) / len(scores)
            row[f"{role}_correct"] = sorted(k for k, v in scores.items() if v)
        result["accuracy"][name] = row
        # One sample per item at T = 1, the temperature of the demo's sampled rules.
        result["accuracy_t1"][name] = {
            "n": len(task.items),
            **{
                role: statistics.fmean(
                    item_scores(model, tokenizer, task, temperature=1.0, seed=seed).values()
                )
                for role, model in (("target", target), ("draft", draft))
            },
        }
    total, n = 0.0, 0
    for name in ("arith", "sort", "story"):
        prompts = [item.prompt for item in tasks.load_task(name).items]
        acc = acceptance_rate(target, draft, tokenizer, prompts, seed)
        result["acceptance"][name] = acc
        total += acc["alpha"] * acc["positions"]
        n += acc["positions"]
        result["check"][f"alpha_{name}"] = acceptance_rate(
            target, draft, tokenizer, prompts[:CHECK_PROMPTS], seed
        )
    result["acceptance"]["all"] = {"alpha": total / n, "positions": n, "mean_tv": 1 - total / n}
    return result


# ---------------------------------------------------------------------- building


def prepare(cfg: ZooConfig, roles: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The tokenizer and each role's encoded training data.

    The tokenizer is learned on the target's corpus (the draft's has the same phrasings,
    drawn with other weights), so both models share one vocabulary.

    Returns:
        ``(tokenizer, {role: {task: encoded examples}})``.
    """
    corpus = {"target": training_examples(cfg, "target")}
    tokenizer = build_tokenizer(
        [p + c for pairs in corpus["target"].values() for p, c in pairs], cfg.vocab_size
    )
    data = {}
    for role in roles:
        examples = corpus.get(role) or training_examples(cfg, role)
        data[role] = {
            name: encode_examples(tokenizer, pairs, loss_on_prompt=(name == "story"))
            for name, pairs in examples.items()
        }
    return tokenizer, data


def load_pair(path: str | Path) -> tuple[Any, Any, Any]:
    """Load ``(target, draft, tokenizer)`` from ``<path>/{target,draft}`` (float32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path / "target")
    target = AutoModelForCausalLM.from_pretrained(path / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(path / "draft", dtype=torch.float32).eval()
    return target, draft, tokenizer


def build(
    out: str | Path,
    cfg: ZooConfig,
    log: Any = print,
    roles: tuple[str, ...] = ("target", "draft"),
) -> dict[str, Any]:
    """Train, save and measure the pair; write ``metrics.json`` and ``MODEL_CARD.md``.

    Args:
        out: Folder to write ``target/``, ``draft/``, the card and the metrics into.
        cfg: The build configuration.
        log: ``callable(str)`` for progress lines.
        roles: Which models to train. Training one role keeps the other one already in
            ``out`` (the data and tokenizer are the same for a given seed and sizes), so
            a draft can be re-tuned without retraining the target; the pair is measured
            once both exist.

    Returns:
        The metrics dictionary written to ``metrics.json``.
    """
    import platform

    import torch

    # Same thread count, same seed -> same weights (CPU kernels are deterministic for a
    # fixed thread count; a different count may change float summation order).
    torch.set_num_threads(cfg.threads)
    out = Path(out)
    load_start = os.getloadavg()[0]
    t0, cpu0 = time.perf_counter(), time.process_time()
    tokenizer, data = prepare(cfg, roles)
    prep_s = time.perf_counter() - t0
    cpu_prep_s = time.process_time() - cpu0
    log(f"data + tokenizer: {prep_s:.1f}s, vocab {len(tokenizer)}")

    metrics: dict[str, Any] = {"config": asdict(cfg), "prep_s": prep_s, "models": {}}
    previous = out / "metrics.json"
    if set(roles) != {"target", "draft"}:
        _check_kept(out, cfg, tokenizer, roles)
        metrics["models"] = json.loads(previous.read_text())["models"]
    specs = {"target": (cfg.target, cfg.seed), "draft": (cfg.draft, cfg.seed + 1)}
    for role in roles:
        spec, seed = specs[role]
        model = make_model(spec, tokenizer, seed)
        log(f"{role}: {count_params(model):,} parameters")
        info = train_model(model, data[role], spec, cfg, seed, log=log)
        info["params"] = count_params(model)
        metrics["models"][role] = info
        model.save_pretrained(out / role)
        tokenizer.save_pretrained(out / role)
    # Totals of a from-scratch build: data + tokenizer once, plus both models.
    metrics["train_total_s"] = prep_s + sum(m["train_s"] for m in metrics["models"].values())
    metrics["train_total_cpu_s"] = cpu_prep_s + sum(
        m["train_cpu_s"] for m in metrics["models"].values()
    )
    metrics["host"] = {
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": cfg.threads,
        # A build time is only comparable on a quiet machine: say how quiet it was.
        "load_avg": [load_start, os.getloadavg()[0]],
    }
    previous.parent.mkdir(parents=True, exist_ok=True)
    previous.write_text(json.dumps(metrics, indent=2) + "\n")
    if not all((out / role / "model.safetensors").exists() for role in specs):
        return metrics
    return remeasure(out)


def _check_kept(out: Path, cfg: ZooConfig, tokenizer: Any, roles: tuple[str, ...]) -> None:
    """Refuse to pair a newly trained model with a kept one it was not built with.

    The kept model must exist, share the regenerated tokenizer, and have been built with
    the same configuration for its role (shape, steps, style, data sizes, seed), or
    ``metrics.json`` would describe a pair that no single build makes.
    """
    previous = out / "metrics.json"
    if not previous.exists():
        raise FileNotFoundError(f"{previous}: training only {', '.join(roles)} needs a built pair")
    old = json.loads(previous.read_text())["config"]
    new = json.loads(json.dumps(asdict(cfg)))
    for role in {"target", "draft"} - set(roles):
        if tokenizer.backend_tokenizer.to_str() != _saved_tokenizer(out / role).to_str():
            raise RuntimeError(f"{out / role}: its tokenizer differs from the regenerated one")
        shared = [k for k in new if k not in ("target", "draft", "target_style", "draft_style")]
        for key in [role, f"{role}_style", *shared]:
            if old.get(key) != new[key]:
                raise ValueError(
                    f"{previous}: config.{key} is {old.get(key)!r}, this build has "
                    f"{new[key]!r}: the kept {role} was built differently; rebuild both"
                )


def continue_training(
    out: str | Path,
    role: str,
    steps: int,
    lr: float,
    log: Any = print,
    measure_pair: bool = True,
) -> dict[str, Any]:
    """Train a built model for ``steps`` more steps (a second warm-up + cosine cycle).

    Deterministic: the data and tokenizer are regenerated from the saved config (the
    tokenizer must equal the saved one), the optimizer starts fresh, batches are seeded
    with ``seed + 100 * (cycle + 1)``. The cycle is recorded in ``metrics.json`` under
    ``models[role]["continued"]`` so the card lists every step a model was trained.

    Args:
        out: A built pair folder.
        role: ``target`` or ``draft``.
        steps: Extra optimizer steps.
        lr: Peak learning rate of the extra cycle.
        log: ``callable(str)`` for progress lines.
        measure_pair: Re-measure the pair afterwards (skip when another cycle follows).

    Returns:
        The updated metrics.
    """
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out)
    metrics = json.loads((out / "metrics.json").read_text())
    raw = dict(metrics["config"])
    raw["mix"] = tuple(raw["mix"])
    raw["target"], raw["draft"] = ModelSpec(**raw["target"]), ModelSpec(**raw["draft"])
    for key in ("target_style", "draft_style"):
        if key not in raw:
            raise ValueError(
                f"{out / 'metrics.json'}: config has no {key}: a pair built before the "
                "phrasing styles cannot be continued; rebuild it"
            )
        style = raw[key]
        raw[key] = tasks.ArithStyle(
            tuple(style["openers"]),
            style["keep_order"],
            tuple(style["connectors"]),
            tuple(style["answers"]),
        )
    cfg = ZooConfig(**raw)
    torch.set_num_threads(cfg.threads)
    t0, cpu0 = time.perf_counter(), time.process_time()
    tokenizer, data = prepare(cfg, (role,))
    if tokenizer.backend_tokenizer.to_str() != _saved_tokenizer(out / role).to_str():
        raise RuntimeError(f"{out / role}: regenerated tokenizer differs from the saved one")
    model = AutoModelForCausalLM.from_pretrained(out / role, dtype=torch.float32)
    previous = metrics["models"][role].setdefault("continued", [])
    seed = cfg.seed + (1 if role == "draft" else 0) + 100 * (len(previous) + 1)
    spec = replace(getattr(cfg, role), steps=steps, lr=lr)
    info = train_model(model, data[role], spec, cfg, seed, log=log)
    model.save_pretrained(out / role)
    info.update(lr=lr, seed=seed)
    previous.append(info)
    prep_s, prep_cpu = time.perf_counter() - t0 - info["train_s"], time.process_time() - cpu0
    metrics["train_total_s"] += info["train_s"] + prep_s
    metrics["train_total_cpu_s"] += prep_cpu
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return remeasure(out) if measure_pair else metrics


def _saved_tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def remeasure(out: str | Path) -> dict[str, Any]:
    """Re-measure a built pair in ``out`` and rewrite ``metrics.json`` and the card.

    Training information is kept from the existing ``metrics.json``.
    """
    import torch

    out = Path(out)
    metrics = json.loads((out / "metrics.json").read_text())
    torch.set_num_threads(metrics["config"]["threads"])
    target, draft, tokenizer = load_pair(out)
    t1 = time.perf_counter()
    metrics.update(measure(target, draft, tokenizer, seed=metrics["config"]["seed"]))
    metrics["weights_bytes"] = {
        role: (out / role / "model.safetensors").stat().st_size for role in ("target", "draft")
    }
    metrics["measure_s"] = time.perf_counter() - t1
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(metrics, target, draft))
    return metrics


def model_card(metrics: dict[str, Any], target: Any, draft: Any) -> str:
    """Render ``MODEL_CARD.md`` from the measured metrics."""
    cfg = metrics["config"]
    models = metrics["models"]

    def shape(role: str) -> str:
        s = cfg[role]
        return (
            f"Llama, {s['num_layers']} layers, hidden {s['hidden_size']}, "
            f"{s['num_heads']} heads, SwiGLU {s['intermediate_size']}, tied embeddings"
        )

    acc = metrics["accuracy"]
    accept = metrics["acceptance"]
    lines = [
        "# Embedded model pair `arith`",
        "",
        "A tiny target/draft pair trained from scratch by `relaxspec_audit/models/zoo.py`, so "
        "that audits, tests and the demo run offline on CPU on a pair that behaves like a "
        "real one: a draft call costs a fraction of a target call, so speculation pays; the "
        "target is clearly better than the draft, which is worse but not useless; and the "
        "target is genuinely uncertain between valid phrasings of an answer, which the "
        "draft weighs differently, so the lossless ratio test rejects drafts the target "
        "finds plausible (what NSD relaxes). `pair_check.md` beside this card checks these "
        "claims against a demo batch's logs (`make demo && make pair-check`). Rebuild the "
        "pair with:",
        "",
        "```",
        *_commands(metrics),
        "```",
        "",
        "| | target | draft |",
        "| --- | --- | --- |",
        f"| architecture | {shape('target')} | {shape('draft')} |",
        f"| parameters | {models['target']['params']:,} | {models['draft']['params']:,} |",
        f"| training steps (batch {cfg['batch_size']}) | {_steps(models['target'])} "
        f"| {_steps(models['draft'])} |",
        f"| final training loss (EMA) | {_last(models['target'], 'final_loss'):.3f} "
        f"| {_last(models['draft'], 'final_loss'):.3f} |",
        f"| training time, wall | {_total(models['target'], 'train_s'):.0f} s | "
        f"{_total(models['draft'], 'train_s'):.0f} s |",
        f"| training time, CPU | {_total(models['target'], 'train_cpu_s'):.0f} s | "
        f"{_total(models['draft'], 'train_cpu_s'):.0f} s |",
    ]
    for name, row in acc.items():
        lines.append(
            f"| held-out accuracy `{name}` (greedy, n = {row['n']}) | "
            f"{100 * row['target']:.1f}% | {100 * row['draft']:.1f}% |"
        )
    for name, row in metrics.get("accuracy_t1", {}).items():
        lines.append(
            f"| held-out accuracy `{name}` (one sample at T = 1, n = {row['n']}) | "
            f"{100 * row['target']:.1f}% | {100 * row['draft']:.1f}% |"
        )
    sizes = metrics.get("weights_bytes", {})
    if sizes:
        lines.append(
            f"| weights (float32 safetensors) | {sizes['target'] / 1e6:.1f} MB "
            f"| {sizes['draft'] / 1e6:.1f} MB |"
        )
    lines += [
        "",
        f"Whole build (data, tokenizer, both models): {metrics['train_total_s']:.0f} s wall, "
        f"{metrics['train_total_cpu_s']:.0f} s CPU, on {cfg['threads']} CPU thread(s) "
        f"(`torch.set_num_threads({cfg['threads']})`; {_load(metrics['host'])}), "
        f"{metrics['host']['platform']}, torch {metrics['host']['torch']}. Weights are "
        "float32 safetensors.",
        "",
        "## Acceptance under `exact` at temperature 1",
        "",
        "Per-position acceptance `α = Σ_x min(p(x), q(x))` (THEORY §2.1), averaged over the "
        "positions of completions sampled from the target (temperature 1, no top-k/top-p) "
        "for the bundled prompts:",
        "",
        "| prompts | α | positions |",
        "| --- | --- | --- |",
    ]
    for name, row in accept.items():
        lines.append(f"| {name} | {row['alpha']:.3f} | {row['positions']} |")
    lines += [
        "",
        "With i.i.d. acceptance, the demo's K = 4 gives `E[τ] = (1 − α^5)/(1 − α)` tokens "
        "per target pass (THEORY §1): "
        + ", ".join(
            f"{expected_tokens_per_pass(row['alpha'], 4):.2f} for `{name}`"
            for name, row in accept.items()
        )
        + ". Acceptance is not i.i.d. along a block, so the demo's measured τ is lower "
        "(`pair_check.md`).",
        "",
        "## Training data",
        "",
        "Generated by the bundled task generators in `relaxspec_audit/tasks/` (seeded; "
        "no downloads), with every prompt of the bundled `arith` and `sort` items removed, "
        "so held-out accuracy is measured on prompts never seen in training:",
        "",
        f"- `arith`: {cfg['n_arith']:,} problems, 2-3 operands in 1..99 with `+`/`-`, worked "
        "steps and the answer (loss on the completion only). A solution is phrased with "
        "choices that do not change the answer: an opener ("
        + ", ".join(f"`{o.strip()}`" if o.strip() else "none" for o in tasks.OPENERS)
        + "), the order of a sum's operands, the connector between steps ("
        + ", ".join(f"`{c.strip()}`" for c in tasks.CONNECTORS)
        + ") and the words before the answer ("
        + ", ".join(f"`{a}`" for a in tasks.ANSWERS)
        + "). The target's corpus draws them with "
        f"{_style(cfg['target_style'])}; the draft's, generated from the same seeded "
        f"problems, with {_style(cfg['draft_style'])}: one house style. That stands in "
        "for the different data real pairs are trained on: the target weighs several valid "
        "phrasings, the draft is confident in one, so the ratio test rejects drafts the "
        "target finds plausible;",
        f"- `sort`: {cfg['n_sort']:,} lists of 4-9 digits and their sorted form (loss on the "
        "completion only);",
        f"- `story`: {cfg['n_story']:,} short stories from a small grammar (loss on all tokens).",
        "",
        f"Batches mix the tasks {cfg['mix'][0]:.0%} / {cfg['mix'][1]:.0%} / {cfg['mix'][2]:.0%}. "
        "AdamW, linear warm-up then cosine decay, gradient clipping at 1.0. The draft is "
        "smaller and trained for fewer steps than the target.",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE with {target.config.vocab_size} tokens (256 byte symbols, 3 "
        "special tokens, merges learned on the target's training text, which holds every "
        "phrasing the draft's does; the text runs out "
        f"of merges below the requested {cfg['vocab_size']}), digits split one per token. "
        f"Special tokens: `{EOS}` (eos, ends every completion), `{PAD}` (pad), `{BOS}` "
        "(bos; defined but never used). Encoding adds no special tokens, so "
        "`tokenizer(prompt)` is exactly what the models saw in training. Saved as "
        "`tokenizer.json` next to each model; both copies are identical.",
        "",
        "## Limits",
        "",
        "Toy models: they know only the three bundled formats. Any other text is encoded "
        "(byte-level) but the output is meaningless. The uncertainty is by construction: "
        "the phrasing choices are the only places where several continuations are right, "
        "and their weights are set in `tasks/bundled.py` (`TARGET_STYLE`, `DRAFT_STYLE`), "
        "not learned from human text. The draft's other errors are wrong digits, where "
        "the target is nearly certain.",
        "",
    ]
    return "\n".join(lines)


def _commands(metrics: dict[str, Any]) -> list[str]:
    cfg = metrics["config"]
    base = "python -m relaxspec_audit.models.zoo --out data/models/arith"
    cmds = [f"{base} --seed {cfg['seed']} --threads {cfg['threads']}"]
    for role in ("target", "draft"):
        for c in metrics["models"][role].get("continued", []):
            cmds.append(
                f"{base} --continue-role {role} --continue-steps {c['steps']} "
                f"--continue-lr {c['lr']:g}"
            )
    return cmds


def _style(style: dict[str, Any]) -> str:
    def weights(w: list[float]) -> str:
        return "/".join(f"{x:g}" for x in w)

    return (
        f"opener weights {weights(style['openers'])}, P(keep the order) "
        f"{style['keep_order']:g}, connector weights {weights(style['connectors'])} and "
        f"answer-word weights {weights(style['answers'])}"
    )


def _load(host: dict[str, Any]) -> str:
    load = host.get("load_avg")
    if not load:
        return "machine load not recorded"
    return (
        f"1-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end, "
        "where the build's own threads count in it"
    )


def _cycles(info: dict[str, Any]) -> list[dict[str, Any]]:
    return [info, *info.get("continued", [])]


def _steps(info: dict[str, Any]) -> str:
    parts = [str(info["steps"])]
    parts += [f"{c['steps']} (2nd cycle, peak lr {c['lr']:g})" for c in info.get("continued", [])]
    return " + ".join(parts)


def _last(info: dict[str, Any], key: str) -> float:
    return _cycles(info)[-1][key]


def _total(info: dict[str, Any], key: str) -> float:
    return sum(c[key] for c in _cycles(info))


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m relaxspec_audit.models.zoo --out data/models/arith``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/models/arith", help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, init and order")
    parser.add_argument("--target-steps", type=int, default=None, help="override target steps")
    parser.add_argument("--draft-steps", type=int, default=None, help="override draft steps")
    parser.add_argument(
        "--roles",
        default="target,draft",
        help="comma-separated models to (re)train; the other is kept from --out",
    )
    parser.add_argument(
        "--continue-role",
        default=None,
        help="train this built model (target or draft) for --continue-steps more steps",
    )
    parser.add_argument("--continue-steps", type=int, default=1000, help="extra steps")
    parser.add_argument("--continue-lr", type=float, default=1e-3, help="extra peak lr")
    parser.add_argument(
        "--no-measure", action="store_true", help="with --continue-role: skip re-measuring"
    )
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="re-measure an existing pair in --out and rewrite metrics.json and the card",
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 is faster on a busy machine)"
    )
    args = parser.parse_args(argv)
    cfg = ZooConfig(seed=args.seed, threads=args.threads)
    if args.target_steps is not None:
        cfg = replace(cfg, target=replace(cfg.target, steps=args.target_steps))
    if args.draft_steps is not None:
        cfg = replace(cfg, draft=replace(cfg.draft, steps=args.draft_steps))

    def log(msg: str) -> None:
        print(msg, flush=True)  # the CLI of a build script, not library output

    if args.continue_role is not None:
        metrics = continue_training(
            args.out,
            args.continue_role,
            args.continue_steps,
            args.continue_lr,
            log=log,
            measure_pair=not args.no_measure,
        )
    elif args.measure_only:
        metrics = remeasure(args.out)
    else:
        roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
        if not roles or not set(roles) <= {"target", "draft"}:
            parser.error(f"--roles: expected target and/or draft, got {args.roles!r}")
        metrics = build(args.out, cfg, log=log, roles=roles)
    keys = ("accuracy", "acceptance", "train_total_s")
    log(json.dumps({k: metrics[k] for k in keys if k in metrics}, indent=1))


if __name__ == "__main__":
    main()
