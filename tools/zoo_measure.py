"""Measuring a built embedded pair: held-out accuracy of each model, ``exact`` acceptance.

Accuracy is greedy (and one sample at T = 1) on the bundled ``arith`` and ``sort`` items,
none of which is in the training data; acceptance is ``α = Σ_x min(p, q)`` per position
(THEORY §2.1) on target-sampled completions. ``tools/zoo.py`` writes the numbers into
``metrics.json``; ``tests/tools/test_zoo.py`` re-measures the check sample.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from zoo_data import MAX_NEW_TOKENS

from relaxspec_audit import tasks


def load_pair(path: str | Path) -> tuple[Any, Any, Any]:
    """Load ``(target, draft, tokenizer)`` from ``<path>/{target,draft}`` (float32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path / "target")
    target = AutoModelForCausalLM.from_pretrained(path / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(path / "draft", dtype=torch.float32).eval()
    return target, draft, tokenizer


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
