"""GSM8K as a bundled task (issue 34, item 1): vendored data, its checks, both prompt forms,
and the numeric scorer on the references themselves.

The scorer is tested on every one of the 1,319 reference solutions (worked steps with
calculator annotations ``<<48/2=24>>``, ``$`` amounts, then ``#### n``), on each answer
line rewritten the ways models write it, and on a list of malformed answers.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from relaxspec_audit.tasks import SPLITS, TaskError, gsm8k, load_jsonl, load_task
from relaxspec_audit.tasks.chat import QWEN_CHAT
from relaxspec_audit.tasks.scorers import extract_answer, score_numeric

DATA = Path(gsm8k.__file__).resolve().parent / "data" / "gsm8k"


@pytest.fixture(scope="module")
def task():
    return load_task("gsm8k")


def test_the_vendored_split_is_the_pinned_file_with_its_license_and_source(task):
    data = (DATA / "test.jsonl").read_bytes()
    assert hashlib.sha256(data).hexdigest() == gsm8k.GSM8K_SHA256
    assert data.count(b"\n") == 1319
    assert (DATA / "LICENSE").read_text().startswith("MIT License")
    source = (DATA / "SOURCE.md").read_text()
    assert gsm8k.GSM8K_SHA256 in source and "openai/grade-school-math" in source
    # A fresh install carries all three: they are package data.
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert (
        "tasks/data/gsm8k/*" in pyproject["tool"]["setuptools"]["package-data"]["relaxspec_audit"]
    )


def test_bare_task_items_splits_and_prompts(task):
    assert task.name == "gsm8k" and task.scorer_name == "numeric" and len(task.items) == 1319
    first = task.items[0]
    assert first.id == "gsm8k-1" and first.reference == "18"
    assert first.prompt.startswith("Q: Janet’s ducks lay 16 eggs") and first.prompt.endswith("\nA:")
    assert len({i.id for i in task.items}) == 1319
    splits = task.splits()
    assert set(splits) == set(SPLITS) and sum(splits.values()) == 1319
    assert min(splits.values()) > 600  # a hash split of 1,319 ids: near half each
    again = load_task("gsm8k")
    assert [(i.id, i.split, i.prompt) for i in again.items] == [
        (i.id, i.split, i.prompt) for i in task.items
    ]
    assert task.stop == ("\nQ:",)
    assert len(load_task("gsm8k", split="confirmation", limit=5).items) == 5


def test_the_chat_variant_has_the_same_items_in_the_same_splits(task):
    chat = load_task("gsm8k-qwen-chat")
    assert chat.name == "gsm8k-qwen-chat" and chat.scorer_name == "numeric"
    assert [(i.id, i.split, i.reference) for i in chat.items] == [
        (i.id, i.split, i.reference) for i in task.items
    ]
    item = chat.items[0]
    question = task.items[0].metadata["question"]
    assert item.prompt == QWEN_CHAT.format(user=gsm8k.GSM8K_USER.format(question=question))
    assert item.prompt.endswith("<|im_start|>assistant\n") and '"#### <number>"' in item.prompt
    assert chat.stop == ()  # the instruct model ends its own turn
    with pytest.raises(TaskError, match="prompt_template: must be one of"):
        gsm8k.load_gsm8k(prompt_template="llama-chat")
    with pytest.raises(TaskError, match="unknown task 'gsm8k-llama-chat'"):
        load_task("gsm8k-llama-chat")


def test_ids_and_splits_match_the_generic_loader_of_the_same_file(task):
    generic = load_jsonl(DATA / "test.jsonl", name="gsm8k")
    assert [(i.id, i.split) for i in generic.items] == [(i.id, i.split) for i in task.items]


def test_every_reference_solution_scores_one(task):
    # The reference is read strictly from the `#### n` line; the scorer reads the whole
    # worked solution, annotations and amounts included, and must find the same number.
    for item in task.items:
        assert score_numeric(item, item.metadata["solution"]) == 1.0, item.id
        assert score_numeric(item, " " + item.metadata["solution"]) == 1.0, item.id


def test_every_answer_line_scores_one_as_models_write_it(task):
    # Commas, a dollar sign, a unit and a full stop, with and without ####: all 1,319.
    for item in task.items:
        steps = item.metadata["solution"].rpartition("####")[0]
        n = int(item.reference)
        for line in (
            f"#### {n:,}",
            f"#### ${n:,}.",
            f"#### {n:,} dollars",
            f"The answer is {n:,}.",
            f"So she makes ${n:,} every day.",
            f"The final answer is \\boxed{{{n}}}",
        ):
            assert score_numeric(item, steps + line) == 1.0, (item.id, line)


MALFORMED = [
    "",
    "I don't know.",
    "####",
    "#### eighteen",
    "The answer is eighteen.",
    "#### 17",
    "#### 180",
    "#### 1.8",
    "#### -18",
    "#### 18.5",
    "She makes $18.50 every day.",
    "#### 1 8",
    "1,8",
    "#### 18 is wrong, it is 19\n#### 19",
    "16 - 3 - 4 = 9 eggs, 9 * 2 = 18, so 18 + 1",
]


@pytest.mark.parametrize("answer", MALFORMED)
def test_malformed_or_wrong_answers_score_zero(task, answer):
    assert task.items[0].reference == "18"
    assert score_numeric(task.items[0], answer) == 0.0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("#### 1,234,567.", 1234567),
        ("$1,234.50 dollars.", 1234.5),
        ("the total is 2,880,000 people", 2880000),
        ("5-3", 3),  # subtraction, not a negative number
        ("5-8=-3", -3),
        ("numbers 1,2,3", 3),  # not thousands groups
        ("it costs $18.", 18),
        ("#### -5 degrees", -5),
    ],
)
def test_extract_answer_reads_commas_signs_currency_units_and_stops(text, value):
    assert extract_answer(text) == pytest.approx(value)


def test_a_changed_or_missing_file_is_refused_naming_it(tmp_path, monkeypatch):
    copy = tmp_path / "test.jsonl"
    shutil.copy(DATA / "test.jsonl", copy)
    lines = copy.read_text().splitlines()
    row = json.loads(lines[0])
    row["answer"] = row["answer"].replace("#### 18", "#### 19")
    copy.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    monkeypatch.setattr(gsm8k, "GSM8K_FILE", copy)
    with pytest.raises(TaskError, match=rf"{copy}: sha256 [0-9a-f]{{64}} does not match"):
        load_task("gsm8k")
    monkeypatch.setattr(gsm8k, "GSM8K_FILE", tmp_path / "absent.jsonl")
    with pytest.raises(TaskError, match=r"absent\.jsonl: cannot read the vendored GSM8K data"):
        load_task("gsm8k-qwen-chat")


def test_a_solution_without_a_final_number_line_names_file_and_line():
    with pytest.raises(TaskError, match=r"x\.jsonl:3: field 'answer' does not end in"):
        gsm8k._final_number(Path("x.jsonl"), 3, "48/2 = 24 clips")
    with pytest.raises(TaskError, match=r"x\.jsonl:4: field 'answer' does not end in"):
        gsm8k._final_number(Path("x.jsonl"), 4, "so #### many")
    assert gsm8k._final_number(Path("x.jsonl"), 5, "... #### 1,072") == "1072"


def test_the_cli_lists_both_variants():
    from relaxspec_audit.cli import main

    result = CliRunner().invoke(main, ["tasks", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    for name in ("gsm8k", "gsm8k-qwen-chat"):
        assert rows[name]["scorer"] == "numeric" and sum(rows[name]["splits"].values()) == 1319
    table = CliRunner().invoke(main, ["tasks"])
    assert "gsm8k-qwen-chat" in table.output
