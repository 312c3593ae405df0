"""Chat templates live with the tasks (tasks.chat); no task module reaches into the pairs."""

from __future__ import annotations

import pytest

from relaxspec_audit.tasks import TaskError
from relaxspec_audit.tasks.chat import CHAT_TEMPLATES, QWEN_CHAT, chat_prompt


def test_chat_prompt_renders_one_user_turn_and_the_prefill():
    prompt = chat_prompt("Hi", "qwen-chat", prefill="```python\n")
    assert prompt == QWEN_CHAT.format(user="Hi") + "```python\n"
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.count("<|im_start|>") == 3 and prompt.count("<|im_end|>") == 2
    assert chat_prompt("Hi", "qwen-chat").endswith("<|im_start|>assistant\n")
    assert list(CHAT_TEMPLATES) == ["qwen-chat"]


def test_unknown_chat_template_names_the_known_ones():
    with pytest.raises(TaskError, match=r"prompt_template: must be one of \['qwen-chat'\]"):
        chat_prompt("Hi", "llama-chat")
