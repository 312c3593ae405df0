"""Reading a batch config file: YAML within limits, with the line of every key and item.

A config file is untrusted input: it is read up to :data:`MAX_CONFIG_BYTES`, strict UTF-8,
its aliases may expand to at most :data:`MAX_CONFIG_NODES` values and nest at most
:data:`MAX_CONFIG_DEPTH` levels (an alias bomb is refused before it is expanded), and a
key given twice in one mapping is an error (YAML would keep the last one silently). The
mappings and lists it returns remember the line of each key and item (:func:`line_of`), so
the validation (``batch.validation``) names ``file:line: field.path`` in every error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

#: Largest config file read, in bytes: a config is a page of YAML, not data.
MAX_CONFIG_BYTES = 1 << 20
#: Most values a config may hold with every alias expanded where it is used: nine nested
#: tenfold aliases are 10⁹ values in 300 bytes, and the plan walks every one of them.
MAX_CONFIG_NODES = 100_000
#: Deepest nesting of mappings and lists (the schema needs 5).
MAX_CONFIG_DEPTH = 50


class BatchConfigError(ValueError):
    """An invalid batch config; the message starts with ``[file:line: ]path``."""

    def __init__(
        self, path: str, message: str, *, source: str | None = None, line: int | None = None
    ):
        self.path = path
        self.message = message
        self.source = source
        self.line = line
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(f"{where}{path}: {message}")


class _LineDict(dict):
    """A mapping that remembers the 1-based line of each key (for error messages)."""

    lines: dict[Any, int]


class _LineList(list):
    """A list that remembers the 1-based line of each item."""

    lines: list[int]


class _YAMLProblem(Exception):
    """A config document refused while it is read (becomes a :class:`BatchConfigError`)."""

    def __init__(self, path: str, message: str, line: int):
        super().__init__(message)
        self.path = path
        self.message = message
        self.line = line


class _LineLoader(yaml.SafeLoader):
    """A safe loader that records lines, refuses duplicate keys and caps alias expansion."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.field_path: list[Any] = []  # keys and indices down to the node being built

    def construct_document(self, node: yaml.Node) -> Any:
        # Before anything is built: a bomb is refused from its few distinct nodes.
        _check_expansion(node)
        return super().construct_document(node)


def _field_path(parts: Sequence[Any]) -> str:
    """``["tasks", 1, "rules"]`` → ``tasks[1].rules`` (a config field path)."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top>"


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document deeper than MAX_CONFIG_DEPTH or larger than MAX_CONFIG_NODES.

    The size counts an aliased node at every use (what walking the loaded data costs),
    memoised per distinct node, so a billion-value bomb is measured in a few steps.

    Raises:
        _YAMLProblem: naming the line where the limit was crossed.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        line = node.start_mark.line + 1
        if id(node) in open_nodes:
            raise _YAMLProblem("<yaml>", "an alias refers to a node that contains it", line)
        if depth > MAX_CONFIG_DEPTH:
            raise _YAMLProblem("<yaml>", f"nested deeper than {MAX_CONFIG_DEPTH} levels", line)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        open_nodes.add(id(node))
        n = 1
        for child in children:
            n += size(child, depth + 1)
            if n > MAX_CONFIG_NODES:
                raise _YAMLProblem(
                    "<yaml>",
                    f"expands to more than {MAX_CONFIG_NODES} values with its aliases "
                    "expanded (an alias bomb?); write the values out or split the config",
                    child.start_mark.line + 1,
                )
        open_nodes.discard(id(node))
        sizes[id(node)] = n
        return n

    size(root, 0)


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    out = _LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            seen = key in out
        except TypeError:  # a list or mapping as a key
            raise _YAMLProblem(
                _field_path(loader.field_path),
                f"a key must be a name or a number, got a {type(key).__name__}",
                line,
            ) from None
        if seen:
            raise _YAMLProblem(
                _field_path([*loader.field_path, key]),
                f"duplicate key (first given at line {out.lines[key]}); give each key once",
                line,
            )
        loader.field_path.append(key)
        try:
            out[key] = loader.construct_object(value_node, deep=True)
        finally:
            loader.field_path.pop()
        out.lines[key] = line
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> _LineList:
    out = _LineList()
    for i, child in enumerate(node.value):
        loader.field_path.append(i)
        try:
            out.append(loader.construct_object(child, deep=True))
        finally:
            loader.field_path.pop()
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def line_of(container: Any, key: Any) -> int | None:
    """The 1-based line ``key`` of a loaded mapping or list was written on (None: unknown)."""
    lines = getattr(container, "lines", None)
    if lines is None:
        return None
    if isinstance(lines, dict):
        return lines.get(key)
    return lines[key] if isinstance(key, int) and 0 <= key < len(lines) else None


def read_yaml(path: Path) -> Any:
    """Parse a config file within the size, UTF-8, nesting, alias and duplicate-key limits.

    Raises:
        BatchConfigError: naming the file, and the line and field where known.
    """
    source = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more, whatever the file claims
    except OSError as exc:
        raise BatchConfigError("<file>", f"cannot read: {exc}", source=source) from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise BatchConfigError(
            "<file>",
            f"larger than {MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES); a batch config is a "
            "page of YAML",
            source=source,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchConfigError(
            "<file>",
            f"not UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})",
            source=source,
            line=raw[: exc.start].count(b"\n") + 1,
        ) from exc
    try:
        return yaml.load(text, Loader=_LineLoader)
    except _YAMLProblem as exc:
        raise BatchConfigError(exc.path, exc.message, source=source, line=exc.line) from None
    except RecursionError:  # the composer recurses per nesting level, before our depth check
        raise BatchConfigError(
            "<yaml>", f"nested deeper than {MAX_CONFIG_DEPTH} levels", source=source
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BatchConfigError(
            "<yaml>",
            f"not valid YAML: {exc}",
            source=source,
            line=mark.line + 1 if mark is not None else None,
        ) from exc
