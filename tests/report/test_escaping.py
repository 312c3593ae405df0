"""Report pages escape every manifest and user value (project issue 13, item 7).

A model folder named ``m<script>alert(1)</script>`` once put a live ``<script>`` into
``signoff.html``: the notebooks' markdown is rendered to HTML with raw tags passed through.
These tests put hostile model paths, task names and reasons through the markdown, the
notebook export and the batch index, and parse the pages for anything live: a script
element, an ``on...`` handler attribute or a ``javascript:`` link.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from _synthetic import family_verdict, manifest_facts, task_audit

from relaxspec_audit import report

SCRIPT = "m<script>alert(1)</script>"
IMG = "t<img src=x onerror=alert(1)>"
LINK = "see [here](javascript:alert(1)) | `x` *y*"


class _Live(HTMLParser):
    """Collects what a browser would run: script elements, handlers, javascript: URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.found.append("<script>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name in ("href", "src") and (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value}>")


def live_parts(page: str) -> list[str]:
    parser = _Live()
    parser.feed(page)
    return parser.found


def render_markdown(tmp: Path, *markdowns: str) -> str:
    """The exported page of a notebook displaying ``markdowns`` (as ``display(Markdown)``)."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("display(Markdown(...))")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"text/markdown": md, "text/plain": "md"})
        for md in markdowns
    ]
    nb.cells = [cell]
    ipynb = tmp / "page.ipynb"
    nbformat.write(nb, str(ipynb))
    return report.export_html(ipynb, tmp / "page.html", title=IMG).read_text()


def hostile_summary():
    fam = family_verdict(rule="nucleus", reference="exact", verdict="PASS", knob="θ",
                         setting="θ=0.9", reasons=[LINK], caveats=[SCRIPT], confirmation=None,
                         headline=LINK)  # fmt: skip
    return task_audit(
        task=IMG,
        task_slug=IMG,
        status="ok",
        ni_margin=0.02,
        alpha=0.05,
        families=[fam],
        errors=[f"collect failed for {SCRIPT}"],
        notebooks=[{"name": "signoff", "html": f"{SCRIPT}.html", "ok": True, "error": None}],
        manifest=manifest_facts(package_version=SCRIPT, git_commit=IMG),
    )


def hostile_facts():
    return manifest_facts(
        models=[
            {"target": {"path": f"/models/{SCRIPT}", "revision": IMG}, "draft": SCRIPT},
        ],
        seeds=[0],
        hosts=[IMG],
        git_commit="abc|def",
        versions=[{"torch": SCRIPT}],
    )


def test_manifest_markdown_escapes_a_script_model_path(tmp_path):
    md = report.manifest_markdown(hostile_facts())
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    # Each value stays in its own cell: a `|` in a value is no column separator.
    assert all(line.count("|") == 3 for line in md.splitlines())
    page = render_markdown(tmp_path, md)
    assert live_parts(page) == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text
    assert "abc|def" in page


def test_signoff_and_choices_markdown_escape_task_names_and_reasons(tmp_path):
    summary = hostile_summary()
    choices = [summary.families[0].model_copy(update={"discovery": None})]
    signoff, chosen = report.signoff_markdown(summary), report.choices_markdown(choices)
    for md in (signoff, chosen):
        assert "<script" not in md and "<img" not in md and "](javascript:" not in md
    page = render_markdown(tmp_path, signoff, chosen)
    assert live_parts(page) == []
    assert "t&lt;img src=x onerror=alert(1)&gt;" in page
    assert "[here](javascript:alert(1))" in page  # the reason's text, not a link


def test_write_index_escapes_every_value(tmp_path):
    page = report.write_index(tmp_path, [hostile_summary()]).read_text()
    assert live_parts(page) == []
    assert "t&lt;img src=x onerror=alert(1)&gt;" in page
    assert "collect failed for m&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # Links stay relative file links whatever the task folder is called.
    assert 'href="./t%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E/summary.json"' in page
    evil = hostile_summary().model_copy(update={"task_slug": "javascript:alert(1)"})
    page = report.write_index(tmp_path, [evil]).read_text()
    assert live_parts(page) == [] and 'href="./javascript%3Aalert%281%29/' in page


def test_export_html_carries_no_script(tmp_path):
    """A notebook's own JavaScript or script-bearing HTML output never runs in the page."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"application/javascript": "alert(2)"}),
        nbformat.v4.new_output(
            "display_data", data={"text/html": "<b>ok</b><SCRIPT>alert(3)</SCRIPT >"}
        ),
    ]
    nb.cells = [cell]
    nbformat.write(nb, str(tmp_path / "x.ipynb"))
    page = report.export_html(tmp_path / "x.ipynb", tmp_path / "x.html").read_text()
    assert live_parts(page) == [] and "<b>ok</b>" in page and "alert(2)" not in page


@pytest.mark.slow
def test_signoff_page_of_a_batch_with_a_script_model_folder(tmp_path, monkeypatch):
    """End to end: the real signoff notebook, a model folder ``m<script>…</script>`` and a
    task file named ``t<img onerror=…>.jsonl``; every page is script-free and shows the
    names as text."""
    from test_batch import fake_collect, model_dirs

    from relaxspec_audit import batch

    monkeypatch.setattr(batch.runner, "_collect_one", fake_collect)
    models = model_dirs(tmp_path)
    target = tmp_path / "models" / SCRIPT  # `m<script>alert(1)<` / `script>`: two folders
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    task = tmp_path / f"{IMG}.jsonl"
    task.write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n')
    config = {
        "batch": "t",
        "defaults": {"target": str(target), "draft": models["draft"], "limit": 6, "k": 4},
        "notebooks": ["signoff"],
        "tasks": [{"task": str(task), "rules": ["exact", {"rule": "nucleus", "theta": 0.9}]}],
    }
    result = batch.run_batch(
        config, out=tmp_path / "reports", runs=tmp_path / "runs", progress=False
    )
    (task_result,) = result.tasks
    (nb,) = task_result.notebooks
    assert nb.ok, nb.error
    signoff = nb.html.read_text()
    assert live_parts(signoff) == [] and "<script" not in signoff.lower()
    assert "m&lt;script&gt;alert(1)&lt;/script&gt;" in signoff
    index = result.index.read_text()
    assert live_parts(index) == [] and "t&lt;img src=x onerror=alert(1)&gt;" in index
