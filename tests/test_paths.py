"""Every repository path named in the docs, the configs and the code's docstrings exists.

A reader follows a path (``collect/round.py``, ``docs/THEORY.md``, ``tools/zoo.py``) to
learn; a path that moved or never existed sends them nowhere. Two shapes are checked:
paths from the repository root (``relaxspec_audit/…``, ``docs/…``, ``tests/…``, …) and
module paths inside the package (``audit/signoff.py``). Notes the repository does not
carry (the steering notes ``DESIGN.md``, ``SPEC.md``, ``REAL_PAIR.md``) are never cited:
docs/ARCHITECTURE.md and docs/THEORY.md are this repository's own.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "relaxspec_audit"

_ROOTS = ("relaxspec_audit", "docs", "tests", "benchmarks", "notebooks", "tools", "data",
          ".ci")  # fmt: skip
_STAGES = ("verify", "collect", "audit", "report", "batch", "tasks", "pairs", "fetch", "_cli",
           "configs")  # fmt: skip
# A path from the repository root: a root folder, then segments; placeholders (<…>, {…},
# *, …, =) mark a pattern, not a path.
_FROM_ROOT = re.compile(
    r"(?<![\w./-])((?:{})/[\w./-]*[\w])".format("|".join(map(re.escape, _ROOTS)))
)
_IN_PACKAGE = re.compile(r"(?<![\w./-])((?:{})/[\w/]+\.(?:py|yaml))\b".format("|".join(_STAGES)))
_ABSENT_NOTES = re.compile(
    r"(?<![\w./])(DESIGN\.md|SPEC\.md|REAL_PAIR\.md|STYLE\.md|DESIGN(?= \")|\.\./shared/\S+)"
)
_PLACEHOLDER = re.compile(r"[<>{}*…=]")


def _sources() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]
    out += sorted((PACKAGE / "configs").glob("*.yaml"))
    out += sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    out += sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "tools").glob("*.py"))
    out += sorted((ROOT / "notebooks").glob("*.ipynb"))
    return out


def _missing(text: str) -> list[str]:
    bad = []
    for match in _FROM_ROOT.finditer(text):
        path = match.group(1).rstrip(".")
        tail = text[match.end() : match.end() + 1]
        if _PLACEHOLDER.search(path) or (tail in "<{*…=" and tail):
            continue
        if not (ROOT / path).exists():
            bad.append(path)
    for match in _IN_PACKAGE.finditer(text):
        path = match.group(1)
        if not (PACKAGE / path).exists() and not (ROOT / path).exists():
            bad.append(path)
    bad += [m.group(1) for m in _ABSENT_NOTES.finditer(text)]
    return bad


def test_every_named_path_exists():
    found = {}
    for source in _sources():
        bad = _missing(source.read_text(encoding="utf-8"))
        if bad:
            found[str(source.relative_to(ROOT))] = sorted(set(bad))
    assert found == {}


def test_the_check_finds_a_missing_path():
    text = "see relaxspec_audit/batch.py and collect/engine.py, DESIGN.md, docs/THEORY.md"
    assert _missing(text) == ["relaxspec_audit/batch.py", "collect/engine.py", "DESIGN.md"]
    assert _missing('(DESIGN "Logs"; ../shared/DESIGN.md)') == ["DESIGN", "../shared/DESIGN.md)"]
    assert _missing("runs/task=<task>/rule=<rule>/ and reports/<batch>/index.html") == []
