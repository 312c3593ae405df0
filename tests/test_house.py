"""The house rules of the package layout (issue 28), checked on the source itself.

- the report stage renders typed results and reads no log: nothing under ``report/``
  imports the collect stage or an audit module that reads logs;
- nothing outside ``verify/`` compares a rule's name: what a rule is (its reference, its
  recovery law, its measures) is the registry's to say;
- no compatibility layer: no reason parsing, no renamed keywords, no re-export shims;
- modules stay small: every module under 600 lines, ``report/`` under about 2,500.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from relaxspec_audit.verify.registry import RULES, TARGET_ONLY

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "relaxspec_audit"
RULE_NAMES = {*RULES, TARGET_ONLY}


def _modules(folder: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _runtime_imports(path: Path) -> list[str]:
    """Modules imported by ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for child in node.body for n in ast.walk(child)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


# Audit modules a renderer may import: typed records, no log reading.
_TYPES = {"relaxspec_audit.audit.records", "relaxspec_audit.audit.results"}


def test_report_reads_no_log():
    bad = []
    for path in _modules(PACKAGE / "report"):
        for name in _runtime_imports(path):
            if name.startswith("relaxspec_audit.collect") or (
                name.startswith("relaxspec_audit.audit")
                and name not in _TYPES
                and not any(name.startswith(t + ".") for t in _TYPES)
                and name != "relaxspec_audit.audit"
            ):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
            if name in ("relaxspec_audit.audit", "relaxspec_audit.collect"):
                bad.append(f"{path.relative_to(ROOT)} imports the stage package {name}")
    assert bad == []


def test_importing_the_report_stage_loads_no_log_reader():
    code = (
        "import sys; import relaxspec_audit.report, relaxspec_audit.report.plots; "
        "print(sorted(m for m in sys.modules if m.startswith('relaxspec_audit.collect') "
        "or m in ('polars', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _mentions_rule(node: ast.AST) -> bool:
    """An expression that stands for a rule's name: ``rule``, ``x.rule``, ``pl.col("rule")``,
    ``row["rule"]``, ``cfg.get("rule")``."""
    text = ast.unparse(node)
    return "rule" in text and "rule_" not in text.replace("rule_recovery", "")


def _literal_rules(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & RULE_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_literal_rules(e) for e in node.elts)) if node.elts else set()
    return set()


def test_nothing_outside_verify_compares_a_rule_name():
    bad = []
    for path in _modules():
        if (PACKAGE / "verify") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = set().union(*(_literal_rules(s) for s in sides))
            if names and any(_mentions_rule(s) for s in sides if not _literal_rules(s)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert bad == [], "ask the registry (verify/registry.py) instead:\n" + "\n".join(bad)


def test_the_rule_name_check_would_catch_one():
    tree = ast.parse('if spec.rule == "nucleus" or pl.col("rule").is_in(("typical",)): pass')
    (cmp,) = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert _literal_rules(cmp.comparators[0]) == {"nucleus"} and _mentions_rule(cmp.left)


@pytest.mark.parametrize(
    "needle",
    ["literal_eval", "renamed_kwargs", "relaxspec_audit.stats", "relaxspec_audit.select",
     "relaxspec_audit.rules", "relaxspec_audit.theory", "relaxspec_audit._compat"],
)  # fmt: skip
def test_no_compatibility_layer(needle):
    hits = [str(p.relative_to(ROOT)) for p in _modules() if needle in p.read_text()]
    assert hits == []
    for name in ("stats", "select", "rules", "theory", "_compat"):
        assert not (PACKAGE / f"{name}.py").exists()


def test_modules_are_small():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _modules()}
    assert {p: n for p, n in sizes.items() if n >= 600} == {}
    report = sum(n for p, n in sizes.items() if p.startswith("relaxspec_audit/report/"))
    assert report < 2600, f"report/ holds {report} lines: it renders, it should be small"
