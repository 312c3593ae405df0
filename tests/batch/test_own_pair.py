"""The README's "Auditing your own pair" commands, run as written on the embedded pair.

The ``collect`` and ``audit`` lines of the README's code block are read from README.md and
run through click's CliRunner as a shell would run them: quotes removed, an unquoted glob
expanded, ``> FILE`` written. Only the model folders (made absolute) and ``--limit``
(three items, to keep the test short) are substituted; ``runs`` is relative to a fresh
working folder. Then the settings rule: a selection that mixes settings is refused,
naming its runs, and ``collect`` and ``audit`` print one acceptance rate under one name
(α = Σ accepted / Σ reached, docs/STATISTICS.md §7).
"""

from __future__ import annotations

import csv
import glob
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAIR = REPO / "data" / "models" / "arith"


def readme_commands() -> list[str]:
    """The ``collect`` and ``audit`` command lines of the README's own-pair section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Auditing your own pair", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    keep = ("relaxspec-audit collect ", "relaxspec-audit audit ")
    return [line.strip() for line in block.splitlines() if line.strip().startswith(keep)]


def _argv(line: str) -> tuple[list[str], str | None]:
    """A command line split as bash would: quotes off, unquoted globs expanded, ``> out``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=">")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    quoted = set(re.findall(r"'([^']*)'", line))
    argv, out = [], None
    tokens = list(lexer)
    while tokens:
        tok = tokens.pop(0)
        if tok == ">":
            out = tokens.pop(0)
        elif tok not in quoted and glob.has_magic(tok):
            argv.extend(sorted(glob.glob(tok)) or [tok])  # bash keeps a pattern matching none
        else:
            argv.append(tok)
    assert argv[0] == "relaxspec-audit"
    return argv[1:], out


def _invoke(args: list[str]):
    from click.testing import CliRunner

    from relaxspec_audit.cli import main

    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def own_pair(tmp_path_factory):
    """Every README collect/audit line run in a fresh folder; their outputs, by line."""
    work = tmp_path_factory.mktemp("own_pair")
    lines = readme_commands()
    assert [ln.split()[1] for ln in lines] == ["collect", "collect", "audit", "audit", "audit"]
    outputs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        for line in lines:
            line = line.replace("data/models/arith", str(PAIR))
            line = re.sub(r"--limit \d+", "--limit 3", line)
            args, out = _argv(line)
            result = _invoke(args)
            assert result.exit_code == 0, f"{line}\n{result.output}"
            if out:
                Path(out).write_text(result.stdout)
            outputs.append((args, result.stdout, out))
        yield work, outputs


def test_readme_commands_run_as_written(own_pair):
    work, outputs = own_pair
    (exact_dir,) = glob.glob(str(work / "runs/task=arith/rule=exact/run=*"))
    (nucleus_dir,) = glob.glob(str(work / "runs/task=arith/rule=nucleus/run=*"))
    exact_id = Path(exact_dir).name.removeprefix("run=")
    text, _, md = (out for _, out, _ in outputs[2:])
    assert "setting                      nucleus θ=0.95" in text
    assert f"reference                    exact: {exact_id}" in text
    assert "acceptance_rate α (Σ accepted / Σ reached)" in text
    # --format csv > audit.csv: one row naming what was audited
    assert outputs[3][2] == "audit.csv"
    (row,) = list(csv.DictReader(io.StringIO((work / "audit.csv").read_text())))
    assert (row["task"], row["rule"], row["setting"]) == ("arith", "nucleus", "nucleus θ=0.95")
    assert json.loads(row["params"]) == {"theta": 0.95}
    assert row["reference"] == "exact" and row["reference_runs"] == exact_id
    assert row["target"].endswith("arith/target") and row["n_requests"] == "3"
    assert "| setting | nucleus θ=0.95 |" in md and f"| reference_runs | {exact_id} |" in md
    assert Path(nucleus_dir).is_dir()


def test_audit_json_names_task_rule_reference_models(own_pair):
    work, _ = own_pair
    base = work / "runs/task=arith"
    result = _invoke(["audit", str(base / "rule=nucleus"), "--reference",
                      str(base / "rule=exact"), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["task"] == "arith"
    assert s["rule"] == {"name": "nucleus", "params": {"theta": 0.95}, "label": "nucleus θ=0.95"}
    (exact_dir,) = glob.glob(str(base / "rule=exact/run=*"))
    assert s["reference"]["runs"] == [Path(exact_dir).name.removeprefix("run=")]
    assert s["reference"]["rule"]["name"] == "exact"
    assert s["models"]["target"]["path"].endswith("arith/target")
    assert s["models"]["draft"]["n_params"] > 0
    # --format json is --json
    same = _invoke(["audit", str(base / "rule=nucleus"), "--format", "json"])
    assert json.loads(same.stdout)["rule"] == s["rule"]


def test_collect_and_audit_print_one_acceptance_rate(own_pair):
    """``collect``'s closing line and ``audit`` give α = Σ accepted / Σ reached (§7)."""
    import polars as pl

    from relaxspec_audit.collect import logs

    work, outputs = own_pair
    for _, out, _ in outputs[:2]:
        printed = re.search(r"acceptance_rate (\d\.\d{3})", out).group(1)
        run_dir = str(work / out.splitlines()[-2].strip())  # printed relative to work
        audited = json.loads(_invoke(["audit", run_dir, "--json"]).stdout)["acceptance_rate"]
        rounds = logs.scan(run_dir, "rounds").collect()
        reached = rounds.select(pl.min_horizontal(pl.col("accepted") + 1, pl.col("k"))).sum()
        alpha = rounds["accepted"].sum() / reached.item()
        assert audited == pytest.approx(alpha, rel=1e-12)
        assert printed == f"{alpha:.3f}"
        # the old figure, Σ accepted / Σ K, differs on these runs: the test can tell them apart
        assert f"{rounds['accepted'].sum() / rounds['k'].sum():.3f}" != printed


def _copy_run(src: str, dst: Path, run_id: str, **config) -> Path:
    """A copy of a run folder whose manifest names another id and setting."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["run_id"] = run_id
    manifest["config"].update(config)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_a_glob_over_two_settings_is_refused_naming_the_runs(own_pair, tmp_path):
    work, _ = own_pair
    runs = tmp_path / "runs"
    shutil.copytree(work / "runs", runs)
    (nucleus_dir,) = glob.glob(str(runs / "task=arith/rule=nucleus/run=*"))
    _copy_run(nucleus_dir, runs / "task=arith/rule=nucleus/run=theta09", "theta09",
              params={"theta": 0.9})  # fmt: skip
    nucleus_id = Path(nucleus_dir).name.removeprefix("run=")
    result = _invoke(["audit", str(runs / "task=arith/rule=nucleus/run=*")])
    assert result.exit_code != 0
    assert "mixes 2 settings" in result.output and "run=theta09" in result.output
    assert f"run={nucleus_id}" in result.output and "nucleus θ=0.9 " in result.output


def test_a_reference_glob_over_several_references(own_pair, tmp_path):
    work, _ = own_pair
    runs = tmp_path / "runs"
    shutil.copytree(work / "runs", runs)
    (exact_dir,) = glob.glob(str(runs / "task=arith/rule=exact/run=*"))
    greedy = _copy_run(exact_dir, runs / "task=arith/rule=exact/run=cold", "cold",
                       temperature=0.0)  # fmt: skip
    nucleus = str(runs / "task=arith/rule=nucleus")
    # quoted: both matches are references, and they are two settings
    result = _invoke(["audit", nucleus, "--reference", str(runs / "task=arith/rule=exact/run=*")])
    assert result.exit_code != 0 and "--reference: the selection mixes 2 settings" in result.output
    assert "run=cold" in result.output
    # unquoted, as the shell hands it over: the second reference lands among RUN_DIRS
    result = _invoke(["audit", nucleus, "--reference", exact_dir, str(greedy)])
    assert result.exit_code != 0 and "mixes 2 settings" in result.output
    spilled = _copy_run(exact_dir, runs / "task=arith/rule=exact/run=again", "again", seed=1)
    result = _invoke(["audit", nucleus, "--reference", exact_dir, str(spilled)])
    assert result.exit_code != 0 and "unquoted --reference glob" in result.output
