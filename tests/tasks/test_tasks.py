"""Task loading, bundled suites and scorers (docs/ARCHITECTURE.md "Tasks"; THEORY §3 splits)."""

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
    # 100 per split: what the demo's verdicts were sized for (configs/demo.yaml `limit`).
    assert task.splits() == {"discovery": 100, "confirmation": 100}
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
        "splits": {"discovery": 100, "confirmation": 100},
        "scorer": "numeric",
    }
    assert rows["story"]["scorer"] == "none" and rows["humaneval"]["scorer"] == "code"
    table = CliRunner().invoke(main, ["tasks"])
    assert table.exit_code == 0 and "arith" in table.output and "sort" in table.output


# ------------------------------------------- HumanEval stop sequences and chat prefill


@pytest.mark.parametrize(
    ("completion", "kept"),
    [
        ("    return 1\n\ndef helper():\n    pass\n", "    return 1\n"),
        ("    return 1\nprint(f(2))\n", "    return 1"),
        ("    return 1\n# tests\nassert f(1)\n", "    return 1"),
        ("    return 1\nif __name__ == '__main__':\n    f()\n", "    return 1"),
        ("    return 1\nclass A:\n    pass\n", "    return 1"),
        ("    return 1\n```\nThis function returns one.", "    return 1\n"),
        ("    # a comment\n    print(x)\n    return 1\n", None),  # indented: body kept
        ("    return 1\n", None),
    ],
)
def test_truncate_code_cuts_at_the_first_stop_sequence(completion, kept):
    assert tasks.truncate_code(completion) == (completion if kept is None else kept)


@pytest.fixture(scope="module")
def humaneval_0():
    return next(i for i in load_task("humaneval", limit=1).items if i.id == "HumanEval/0")


def test_code_scorer_cuts_a_correct_body_that_runs_on(humaneval_0):
    # Scorer behaviour independent of THEORY: the standard HumanEval stop sequences (Chen et al.
    # 2021). Without the cut, the unfinished second def / the NameError in print() fails.
    body = humaneval_0.reference
    task = load_task("humaneval", limit=1)
    assert humaneval_0.metadata["code_prefix"] == humaneval_0.prompt
    assert task.score(humaneval_0, body + "\n\ndef check_solution(:\n    assert") == 1.0
    assert task.score(humaneval_0, body + "\nprint(undefined_name)\n") == 1.0
    assert task.score(humaneval_0, body + "\n```\n\nExplanation: it loops") == 1.0
    # A wrong body that runs on is still wrong.
    assert task.score(humaneval_0, "    return False\n\ndef other():\n    pass\n") == 0.0


def test_humaneval_qwen_chat_prefills_the_prompt_and_scores_the_plain_program(humaneval_0):
    from relaxspec_audit.tasks.chat import QWEN_CHAT

    task = load_task("humaneval-qwen-chat", split=humaneval_0.split, limit=1)
    assert task.name == "humaneval-qwen-chat" and task.scorer_name == "code"
    item = task.items[0]
    plain = humaneval_0.prompt
    assert item.id == "HumanEval/0" and item.split == humaneval_0.split
    assert item.metadata["code_prefix"] == plain
    user = f"Complete the following Python function.\n```python\n{plain}```"
    assert item.prompt == QWEN_CHAT.format(user=user) + "```python\n" + plain
    assert item.prompt.startswith("<|im_start|>system\n") and item.prompt.endswith(plain)
    # The chat text never reaches the program: reference 1.0, wrong body 0.0, a fenced
    # answer that closes with ``` and chat text after it is cut and still passes.
    assert task.score(item, item.reference) == 1.0
    assert task.score(item, item.reference + "```\nThis checks every pair.") == 1.0
    assert task.score(item, "    return False\n```") == 0.0
    full = load_task("humaneval-qwen-chat")
    assert len(full.items) == 164 and full.splits() == load_task("humaneval").splits()
    with pytest.raises(TaskError, match="prompt_template: must be one of"):
        tasks.load_humaneval(prompt_template="llama-chat")
    with pytest.raises(TaskError, match="unknown task 'humaneval-llama-chat'"):
        load_task("humaneval-llama-chat")


# ---------------------------------------------------------------------- MT-Bench


def _mtbench_cache(tmp_path, monkeypatch, rows=None):
    from relaxspec_audit.fetch.cache import CACHE_ENV
    from relaxspec_audit.tasks.mtbench_fetch import mtbench_task_path

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = mtbench_task_path()
    if rows is not None:
        path.parent.mkdir(parents=True)
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_mtbench_loads_from_the_real_pair_cache(tmp_path, monkeypatch):
    rows = [
        {"id": f"mtbench-{81 + i}", "prompt": f"<|im_start|>user\nQ{i}", "reference": None}
        for i in range(40)
    ]
    _mtbench_cache(tmp_path, monkeypatch, rows)
    task = load_task("mtbench")
    assert task.name == "mtbench" and task.scorer_name == "none" and len(task.items) == 40
    assert task.score(task.items[0], "anything") is None
    assert task.items[3].split == tasks.hash_split("mtbench-84")
    assert len(load_task("mtbench", split="confirmation", limit=2).items) == 2
    listed = {row["name"]: row for row in tasks.list_tasks()}
    assert listed["mtbench"]["available"] is True
    assert listed["mtbench"]["splits"] == task.splits() and listed["mtbench"]["scorer"] == "none"
    assert listed["humaneval-qwen-chat"]["scorer"] == "code"


def test_mtbench_absent_is_listed_unavailable_and_says_how_to_fetch(tmp_path, monkeypatch):
    path = _mtbench_cache(tmp_path, monkeypatch)
    with pytest.raises(TaskError, match=r"run `relaxspec-audit fetch-real`") as info:
        load_task("mtbench")
    assert str(path) in str(info.value)
    listed = {row["name"]: row for row in tasks.list_tasks()}
    assert listed["mtbench"]["available"] is False and listed["mtbench"]["splits"] == {}
    assert "relaxspec-audit fetch-real" in listed["mtbench"]["description"]
    assert listed["arith"]["available"] is True
    # `relaxspec-audit tasks` still prints the table, mtbench marked unavailable.
    from relaxspec_audit.cli import main

    table = CliRunner().invoke(main, ["tasks"])
    assert table.exit_code == 0, table.output
    assert "Not available" in next(x for x in table.output.splitlines() if "mtbench" in x)


def test_mtbench_loads_without_torch(tmp_path):
    # The lightweight path (tasks, CLI listing) must not import torch or transformers.
    import subprocess
    import sys

    path = tmp_path / "cache" / "mtbench" / "mtbench_turn1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"id": "mtbench-81", "prompt": "p", "reference": None}) + "\n")
    code = (
        "import sys; from relaxspec_audit import tasks; t = tasks.load_task('mtbench'); "
        "tasks.list_tasks(); assert len(t.items) == 1; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    env = {**__import__("os").environ, "RELAXSPEC_AUDIT_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_task_paths_expand_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _write(tmp_path, [json.dumps({"id": "a", "prompt": "p", "reference": "1"})], name="t.jsonl")
    task = load_task("~/t.jsonl")
    assert task.name == "t" and task.items[0].reference == "1"


def test_demo_decodes_every_bundled_item():
    import yaml

    from relaxspec_audit import batch

    config = yaml.safe_load(batch.bundled_config("demo").read_text())
    assert config["defaults"]["limit"] == tasks.BUNDLED_PER_SPLIT
