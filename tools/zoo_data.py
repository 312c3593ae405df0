"""The embedded pair's training data: the corpus, the tokenizer and the encoded examples.

The corpus comes from the bundled task generators of :mod:`relaxspec_audit.tasks`
(``arith``, ``sort``, ``story``) with every prompt of the bundled task items dropped, so
the evaluation is held out; the tokenizer is a byte-level BPE learned on it (digits one
per token). ``tools/zoo.py`` trains the models on what :func:`prepare` returns.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from relaxspec_audit import tasks

if TYPE_CHECKING:
    from zoo import ZooConfig

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"
# Completions of the bundled tasks fit in this many tokens (story is the longest).
MAX_NEW_TOKENS = 48


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
