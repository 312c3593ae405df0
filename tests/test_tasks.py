"""Task loading, bundled suites and scorers (DESIGN "tasks.py"; SPEC §3 splits)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from relaxspec_audit import tasks
from relaxspec_audit.tasks import TaskError, TaskItem, extract_answer, load_task

# ----------------------------------------------------------------- bundled suites


@pytest.mark.parametrize("name", tasks.BUNDLED)
def test_bundled_suite_has_disjoint_splits_and_is_deterministic(name):
    task = load_task(name)
    assert task.splits() == {"discovery": 60, "confirmation": 60}
    ids = [item.id for item in task.items]
    assert len(set(ids)) == len(ids)
    prompts = {s: {i.prompt for i in task.items if i.split == s} for s in tasks.SPLITS}
    assert not prompts["discovery"] & prompts["confirmation"]
    again = load_task(name)
    assert [(i.id, i.prompt, i.reference) for i in again.items] == [
        (i.id, i.prompt, i.reference) for i in task.items
    ]


def test_arith_references_are_the_value_of_the_expression_and_solutions_score_1():
    task = load_task("arith")
    for item in task.items:
        expr = item.prompt.removeprefix("Q: ").split("=?")[0]
        assert int(item.reference) == eval(expr)
        assert task.score(item, " " + item.metadata["solution"]) == 1.0
        wrong = item.metadata["solution"].rsplit("####", 1)[0] + f"#### {eval(expr) + 1}"
        assert task.score(item, wrong) == 0.0
    assert any(item.prompt.count("+") + item.prompt.count("-") == 2 for item in task.items)


def test_sort_and_story_scorers():
    sort = load_task("sort")
    item = sort.items[0]
    digits = item.prompt.removeprefix("Sort: ").split("\n")[0].split()
    assert item.reference == " ".join(sorted(digits))
    assert sort.score(item, " " + item.reference) == 1.0
    assert sort.score(item, " " + " ".join(digits[::-1]) + " 0") == 0.0
    story = load_task("story")
    assert story.score(story.items[0], " lived by the sea.") is None
    assert all(i.reference is None for i in story.items)


def test_split_and_limit():
    task = load_task("arith", split="confirmation", limit=7)
    assert len(task.items) == 7 and {i.split for i in task.items} == {"confirmation"}
    with pytest.raises(TaskError, match="split: must be one of"):
        load_task("arith", split="test")
    with pytest.raises(TaskError, match="unknown task 'nope'"):
        load_task("nope")


# ------------------------------------------------------------- numeric extraction


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        (" 17+25=42. 42-9=33. #### 33", 33),
        ("#### 1,234", 1234),
        ("The total is $1,234,567.", 1234567),
        ("#### -5", -5),
        ("it drops to -12 degrees", -12),
        ("#### 3.50 dollars", 3.5),
        ("#### 72\n\nThen 99 more words 100", 72),  # trailing text after ####
        ("so 3 apples and 4 pears, 7 in all.", 7),  # no ####: last number
        ("#### \n answer 8", 8),  # empty after ####: first number after it
        ("#### .5", 0.5),
    ],
)
def test_extract_answer_edge_cases(text, value):
    assert extract_answer(text) == pytest.approx(value)


def test_extract_answer_without_number_and_numeric_scorer():
    assert extract_answer("no digits here") is None
    item = TaskItem("a", "Q", "Natalia sold 48/2 = 24 clips... #### 1,072", "discovery")
    assert tasks.score_numeric(item, "so the answer is 1072.") == 1.0
    assert tasks.score_numeric(item, "#### 1,072.00 clips") == 1.0
    assert tasks.score_numeric(item, "#### 1,073") == 0.0
    assert tasks.score_numeric(item, "I don't know") == 0.0
    assert tasks.score_numeric(TaskItem("b", "Q", None, "discovery"), "1") is None


# ----------------------------------------------------------------- JSONL loading


def _write(tmp_path, lines, name="set.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_loader_generic(tmp_path):
    rows = [{"id": f"q{i}", "prompt": f"P{i}", "reference": str(i)} for i in range(200)]
    rows[0]["split"] = "confirmation"
    rows[1]["reference"] = 5  # numbers are accepted as references
    path = _write(tmp_path, [json.dumps(r) for r in rows] + [""])  # blank line ignored
    task = load_task(str(path))
    assert task.name == "set" and len(task.items) == 200 and task.scorer_name == "numeric"
    assert task.items[0].split == "confirmation" and task.items[1].reference == "5"
    counts = task.splits()
    assert 70 <= counts["discovery"] <= 130  # hash split: about half/half
    # Hash split is a pure function of the id (stable across processes and files).
    assert task.items[5].split == tasks.hash_split("q5")
    assert task.score(task.items[3], "#### 3") == 1.0


def test_jsonl_loader_text_references_use_exact_match(tmp_path):
    path = _write(tmp_path, [json.dumps({"id": 1, "prompt": "p", "reference": "1 2 3"})])
    task = load_task(path)
    assert task.scorer_name == "exact" and task.items[0].id == "1"
    assert task.score(task.items[0], " 1 2 3 ") == 1.0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"id": "a", "prompt": "p", "reference": "1"}', '{"id": "b", "prompt": '],
            r"set\.jsonl:2: malformed JSON",
        ),
        (
            [
                '{"id": "a", "prompt": "p", "reference": "1"}',
                "",
                '{"id": "a", "prompt": "q", "reference": "2"}',
            ],
            r"set\.jsonl:3: field 'id': duplicate id 'a' \(first seen on line 1\)",
        ),
        (['{"id": "a", "reference": "1"}'], r"set\.jsonl:1: missing field 'prompt'"),
        (['{"id": "a", "prompt": "p"}'], r"set\.jsonl:1: missing field 'reference'"),
        (['{"prompt": "p", "reference": "1"}'], r"set\.jsonl:1: missing field 'id'"),
        (
            ['{"id": "a", "prompt": 7, "reference": "1"}'],
            r"set\.jsonl:1: field 'prompt' must be str, got int",
        ),
        (
            ['{"id": true, "prompt": "p", "reference": "1"}'],
            r"set\.jsonl:1: field 'id' must be str or int, got bool",
        ),
        (
            ['{"id": "a", "prompt": "p", "reference": [1]}'],
            r"set\.jsonl:1: field 'reference' must be str or int or float or null, got list",
        ),
        (
            ['{"id": "a", "prompt": "p", "reference": "1", "split": "train"}'],
            r"set\.jsonl:1: field 'split' must be one of",
        ),
        (["[1, 2]"], r"set\.jsonl:1: expected a JSON object, got list"),
        ([""], r"set\.jsonl: no items"),
    ],
)
def test_jsonl_loader_errors_name_file_line_and_field(tmp_path, lines, message):
    path = _write(tmp_path, lines)
    with pytest.raises(TaskError, match=message):
        load_task(path)


def test_gsm8k_format(tmp_path):
    rows = [
        {
            "question": "Tom has 1,200 apples and eats 3. How many?",
            "answer": "1,200-3 = <<1200-3=1197>>1197\n#### 1,197",
        },
        {"question": "It is 5 degrees and falls by 8. Temperature?", "answer": "5-8=-3\n#### -3"},
        {"question": "Half of 7?", "answer": "7/2=3.5\n#### 3.5"},
    ]
    path = _write(tmp_path, [json.dumps(r) for r in rows], name="gsm8k_test.jsonl")
    task = load_task(path)
    assert task.name == "gsm8k_test" and task.scorer_name == "numeric"
    assert task.items[0].prompt == "Q: Tom has 1,200 apples and eats 3. How many?\nA:"
    assert task.items[0].id == "gsm8k_test-1"
    assert task.score(task.items[0], " 1200-3=1197. #### 1197") == 1.0
    assert task.score(task.items[0], " #### 1,197 apples") == 1.0
    assert task.score(task.items[1], " it is -3 now") == 1.0
    assert task.score(task.items[1], " #### 3") == 0.0
    assert task.score(task.items[2], "#### 3.50") == 1.0
    bad = _write(tmp_path, ['{"question": "q", "answer": "no number"}'], name="g.jsonl")
    with pytest.raises(TaskError, match=r"g\.jsonl:1: field 'answer' holds no final number"):
        load_task(bad)
    bad = _write(tmp_path, [json.dumps(rows[0]), '{"question": "q", "answer": 3}'], name="h.jsonl")
    with pytest.raises(TaskError, match=r"h\.jsonl:2: field 'answer' must be str, got int"):
        load_task(bad)


# ---------------------------------------------------------------------- HumanEval


def test_humaneval_from_the_installed_package_with_the_code_scorer():
    task = load_task("humaneval")
    assert len(task.items) == 164 and task.scorer_name == "code"
    assert sum(task.splits().values()) == 164 and set(task.splits()) == set(tasks.SPLITS)
    item = next(i for i in task.items if i.id == "HumanEval/0")
    assert task.score(item, item.reference) == 1.0  # canonical solution passes
    assert task.score(item, "    return False\n") == 0.0  # wrong solution fails
    hung = TaskItem(item.id, item.prompt, None, item.split, {**item.metadata, "timeout_s": 1})
    assert task.score(hung, "    while True:\n        pass\n") == 0.0


# --------------------------------------------------------------------------- CLI


def test_cli_tasks_json_lists_bundled_tasks():
    from relaxspec_audit.cli import main

    result = CliRunner().invoke(main, ["tasks", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["arith"] == {
        "name": "arith",
        "splits": {"discovery": 60, "confirmation": 60},
        "scorer": "numeric",
    }
    assert rows["story"]["scorer"] == "none" and rows["humaneval"]["scorer"] == "code"
    table = CliRunner().invoke(main, ["tasks"])
    assert table.exit_code == 0 and "arith" in table.output and "sort" in table.output
