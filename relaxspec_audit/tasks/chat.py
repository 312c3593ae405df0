"""Chat templates: how a task's question becomes one user turn for an instruct model.

A chat task variant is named ``<task>-<template>`` (``humaneval-qwen-chat``,
``gsm8k-qwen-chat``); its prompts are the template rendered around the task's user turn,
optionally with the start of the assistant's answer pre-filled. The decoder encodes a
prompt with ``tokenizer(prompt)``, which parses the template's special tokens, so the
model sees a proper chat turn without ``apply_chat_template`` (and without a tokenizer
at task-loading time).
"""

from __future__ import annotations

from relaxspec_audit.tasks.task import TaskError

#: Qwen2.5's chat template for one user turn with its default system prompt (ChatML), as
#: ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` renders it (checked
#: by the ``real`` smoke test).
QWEN_CHAT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
)
#: Every chat template by name (the ``<template>`` of a ``<task>-<template>`` task name).
CHAT_TEMPLATES: dict[str, str] = {"qwen-chat": QWEN_CHAT}


def chat_prompt(user: str, template: str, prefill: str = "") -> str:
    """Render ``user`` as one chat turn, with the assistant's answer opened by ``prefill``.

    Args:
        user: The user turn's text.
        template: One of :data:`CHAT_TEMPLATES`.
        prefill: Text the assistant's turn starts with (generated tokens continue it).

    Returns:
        The model prompt.

    Raises:
        TaskError: Unknown template.
    """
    if template not in CHAT_TEMPLATES:
        raise TaskError(f"prompt_template: must be one of {list(CHAT_TEMPLATES)}, got {template!r}")
    return CHAT_TEMPLATES[template].format(user=user) + prefill
