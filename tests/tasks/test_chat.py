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


def _imports(path):
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_no_task_module_imports_the_pairs():
    # Tasks own their templates and their data; the pairs' code (and the maintainer tools)
    # may use tasks, never the reverse. Imports inside functions count too.
    from pathlib import Path

    import relaxspec_audit.tasks

    folder = Path(relaxspec_audit.tasks.__file__).parent
    modules = sorted(folder.glob("*.py"))
    assert {p.name for p in modules} >= {"chat.py", "humaneval.py", "mtbench.py"}
    for path in modules:
        bad = [n for n in _imports(path) if n.startswith(("relaxspec_audit.pairs", "zoo"))]
        assert not bad, (path.name, bad)
    # The check sees function-level imports: mtbench.py reads its path lazily.
    assert "relaxspec_audit.tasks.mtbench_fetch" in _imports(folder / "mtbench.py")
