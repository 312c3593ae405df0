"""Build (train) the embedded target/draft model pair under ``data/models/<name>/``.

Maintainer tooling, not part of the package: ``make models`` runs
``python tools/zoo.py --out data/models/arith --seed 0 --threads 2``. It

1. generates a training corpus from the bundled task generators of :mod:`tasks`
   (``arith``, ``sort``, ``story``), dropping every prompt of the bundled task items so
   the evaluation is held out (``zoo_data``);
2. trains a byte-level BPE tokenizer on it (digits split one per token, so numbers are
   spelled digit by digit) and wraps it as a ``PreTrainedTokenizerFast`` (``zoo_data``);
3. trains two Llama causal LMs on the same data: a target, and a much smaller draft
   trained for fewer steps, so the draft is fluent but clearly worse;
4. saves each as ``{target,draft}/`` (safetensors, config, generation config, tokenizer),
   loadable offline with ``AutoModelForCausalLM.from_pretrained`` and
   ``AutoTokenizer.from_pretrained``;
5. measures held-out accuracy of both models (greedy) and the ``exact``-rule acceptance
   at temperature 1 (``α = Σ_x min(p, q)`` per position, THEORY §2.1, averaged over
   target-sampled completions; ``zoo_measure``), and writes ``metrics.json`` and
   ``MODEL_CARD.md`` (``zoo_card``).

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
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from zoo_card import model_card
from zoo_data import MAX_NEW_TOKENS, prepare
from zoo_measure import load_pair, measure

from relaxspec_audit import tasks


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


# ---------------------------------------------------------------------- building


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


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python tools/zoo.py --out data/models/arith``."""
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
