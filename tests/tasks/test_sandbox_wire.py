"""The code check's wire format: plain data crosses exactly, anything else is refused."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from relaxspec_audit.tasks import sandbox_wire as wire
from relaxspec_audit.tasks.scorers import score_code
from relaxspec_audit.tasks.task import TaskItem

VALUES = [
    None,
    True,
    0,
    -(2**80),
    1.5,
    -0.0,
    "ünï",
    b"\x00\xff",
    3 + 4j,
    [1, [2.0, "3"]],
    (1,),
    (),
    {"a": 1, 2: (3, 4), (5, 6): None},
    {1, "x", (2, 3)},
    frozenset({1, 2}),
    [[[[[]]]]],
]


def _cross(value):
    return wire.from_plain(json.loads(json.dumps(wire.to_plain(value))))


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_plain_values_cross_with_their_types(value):
    got = _cross(value)
    assert got == value and type(got) is type(value)
    if isinstance(value, list | tuple):
        assert [type(v) for v in got] == [type(v) for v in value]


def test_non_finite_floats_and_int_float_distinction_survive():
    got = _cross([math.inf, -math.inf, math.nan, 1, 1.0])
    assert got[:2] == [math.inf, -math.inf] and math.isnan(got[2])
    assert type(got[3]) is int and type(got[4]) is float


def test_honest_return_values_are_converted_to_plain_data():
    class Number(int):
        def __eq__(self, other):  # a subclass's own __eq__ never reaches the checker
            return True

        __hash__ = int.__hash__

    assert _cross(Number(5)) == 5 and type(_cross(Number(5))) is int
    assert _cross(np.int64(7)) == 7 and type(_cross(np.int64(7))) is int
    assert _cross(np.array([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert _cross(np.float64(0.5)) == 0.5
    assert _cross(x * x for x in range(3)) == [0, 1, 4]
    assert _cross({"a": 1}.keys()) == ["a"] and _cross(map(str, [1])) == ["1"]


def test_objects_that_are_not_plain_data_are_refused():
    class Anything:
        def __eq__(self, other):
            return True

    with pytest.raises(wire.WireError, match=r"cannot send a .*Anything: not plain data"):
        wire.to_plain(Anything())
    with pytest.raises(wire.WireError, match="cannot send"):
        wire.to_plain([1, lambda: 0])
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError, match="nested deeper"):
        wire.to_plain(deep)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"__class__": "x"}, "not a tagged value"),
        (["l", [1], 2], "not a tagged value"),
        (["q", []], "unknown tag 'q'"),
        (["s", [["l", []]]], "unhashable"),
        (["d", [[["l", []], 1]]], "unhashable"),
        (["d", [[1]]], r"not a \[key, value\] pair"),
        (["b", "zz"], "non-hexadecimal"),
        (["c", ["1", 2]], "unknown tag 'c'"),
    ],
)
def test_the_checker_refuses_anything_but_tagged_plain_data(message, error):
    with pytest.raises(wire.WireError, match=error):
        wire.from_plain(message)


def test_messages_are_framed_bounded_and_json():
    r, w = os.pipe()
    try:
        wire.write_message(w, wire.to_plain({"k": [1, 2]}))
        assert wire.from_plain(wire.read_message(r)) == {"k": [1, 2]}
        os.write(w, (1 << 40).to_bytes(8, "big"))
        with pytest.raises(wire.WireError, match="more than the 16777216 allowed"):
            wire.read_message(r)
        os.write(w, (3).to_bytes(8, "big") + b"{x]")
        with pytest.raises(wire.WireError, match="not a JSON message"):
            wire.read_message(r)
        os.write(w, (8).to_bytes(8, "big") + b"[" * 8)
        with pytest.raises(wire.WireError, match="not a JSON message"):
            wire.read_message(r)
    finally:
        os.close(w)
    with pytest.raises(wire.WireError, match="closed the channel"):
        wire.read_message(r)
    os.close(r)


ITEM = TaskItem(
    id="wire/0",
    prompt="def f(x):\n",
    reference=None,
    split="discovery",
    metadata={
        "test": (
            "def check(candidate):\n"
            "    assert candidate(3) == (3, [9.0], {'x': {3}})\n"
            "    try:\n"
            "        candidate(-1)\n"
            "    except ValueError as exc:\n"
            "        assert 'negative' in str(exc)\n"
            "    else:\n"
            "        raise AssertionError('no error')\n"
        ),
        "entry_point": "f",
        "timeout_s": 10.0,
    },
)


def test_a_correct_body_with_containers_numpy_and_builtin_exceptions_scores_one():
    body = (
        "    import numpy as np\n"
        "    if x < 0:\n"
        "        raise ValueError('negative')\n"
        "    return (np.int64(x), list(np.array([x * x], dtype=float)), {'x': {x}})\n"
    )
    assert score_code(ITEM, body) == 1.0
    # An exception crosses by its name, as a builtin type only: a class of the completion's
    # (even a ValueError subclass) arrives as a generic error the check does not catch.
    custom = body.replace("raise ValueError", "raise type('Custom', (ValueError,), {})")
    assert score_code(ITEM, custom) == 0.0
