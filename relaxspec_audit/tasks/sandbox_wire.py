"""The code check's wire format: plain values between the checker and the candidate.

The tests run in one process (the checker) and the completion in another (the
candidate); each call of the function under test crosses a pair of pipes as one message:
the call's arguments one way, its return value or the name and text of the exception it
raised the other way. Only plain data crosses: ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, and lists, tuples, dicts, sets and frozensets of them.
A message is an 8-byte big-endian length and that many bytes of JSON, in which every
container is a ``[tag, items]`` pair (``"l"`` list, ``"t"`` tuple, ``"d"`` dict as
``[key, value]`` pairs, ``"s"`` set, ``"f"`` frozenset, ``"b"`` bytes as hex, ``"c"``
complex as ``[real, imag]``) and every scalar is itself, so a decoded value has exactly
the types that were sent.

The checker decodes what the candidate sends as untrusted input (:func:`from_plain`):
bounded in size and depth, plain types only, so no object of the completion's (an
``__eq__`` that is always true, a ``__del__``) ever exists in the checker. The candidate
side is generous with honest return values (:func:`to_plain`): subclasses of the plain
types become their base values, numpy arrays and scalars their ``tolist()``, generators,
iterators and dict views lists.

Standard library only, and no imports from the package: this file's text is also sent to
the sandboxed interpreters (``tasks.sandbox_harness``), which run in isolated mode.
"""

import json
import os
import struct
import types

#: Largest message the checker reads, in bytes (a return value, JSON-encoded).
MAX_MESSAGE = 16 << 20
#: Deepest nesting of containers either side encodes or decodes.
MAX_DEPTH = 200

_HEADER = struct.Struct(">Q")
_SCALARS = (type(None), bool, int, float, str)
_TAGS = {"l": list, "t": tuple, "s": set, "f": frozenset}
_ITERATORS = (
    type(iter([])),
    type(iter(())),
    type(iter(range(0))),
    type(iter("")),
    type({}.keys()),
    type({}.values()),
    type({}.items()),
    types.GeneratorType,
    map,
    filter,
    zip,
    reversed,
    enumerate,
)


class WireError(Exception):
    """A value that cannot cross, or a message that is not one (the check fails)."""


def to_plain(value: object, depth: int = 0) -> object:
    """The JSON-ready form of ``value`` (plain data; see the module docstring).

    Raises:
        WireError: the value holds something that is not plain data, or nests too deep.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, bool):  # pragma: no cover - bool has no subclasses
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, complex):
        return ["c", [value.real, value.imag]]
    if isinstance(value, bytes | bytearray):
        return ["b", bytes(value).hex()]
    if isinstance(value, dict):
        return ["d", [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]]
    for tag, base in (("l", list), ("t", tuple), ("f", frozenset), ("s", set)):
        if isinstance(value, base):
            return [tag, [to_plain(v, depth + 1) for v in value]]
    if kind.__module__ == "numpy" and callable(getattr(value, "tolist", None)):
        return to_plain(value.tolist(), depth + 1)
    if isinstance(value, _ITERATORS):
        return ["l", [to_plain(v, depth + 1) for v in value]]
    raise WireError(f"cannot send a {kind.__module__}.{kind.__qualname__}: not plain data")


def from_plain(obj: object, depth: int = 0) -> object:
    """The value a JSON-decoded message stands for, plain types only.

    Raises:
        WireError: anything but the tagged form of plain data.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH} levels")
    if type(obj) in _SCALARS:
        return obj
    if type(obj) is not list or len(obj) != 2 or type(obj[0]) is not str:
        raise WireError(f"not a tagged value: {type(obj).__name__}")
    tag, items = obj
    try:
        if tag in _TAGS and type(items) is list:
            return _TAGS[tag](from_plain(v, depth + 1) for v in items)
        if tag == "d" and type(items) is list:
            out: dict = {}
            for pair in items:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("a dict item is not a [key, value] pair")
                out[from_plain(pair[0], depth + 1)] = from_plain(pair[1], depth + 1)
            return out
        if tag == "b" and type(items) is str:
            return bytes.fromhex(items)
        if tag == "c" and type(items) is list and len(items) == 2:
            real, imag = items
            if type(real) in (int, float) and type(imag) in (int, float):
                return complex(real, imag)
    except TypeError as exc:  # an unhashable key or set member
        raise WireError(str(exc)) from None
    except ValueError as exc:  # bad hex
        raise WireError(str(exc)) from None
    raise WireError(f"unknown tag {tag!r}")


def write_message(fd: int, obj: object) -> None:
    """Send one JSON message (already in plain form) on ``fd``."""
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WireError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int, limit: int = MAX_MESSAGE) -> object:
    """Receive one JSON message from ``fd``, refusing one longer than ``limit`` bytes.

    Raises:
        WireError: the channel closed, the message is too long or is not JSON.
    """
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    if size > limit:
        raise WireError(f"a message of {size} bytes, more than the {limit} allowed")
    try:
        return json.loads(_read_exactly(fd, size).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not a JSON message ({type(exc).__name__})") from None
