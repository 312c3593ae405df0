"""Every report page of a small real batch reads as a page, not as a notebook dump.

One batch on the embedded pair (both bundled tasks: ``arith`` is scored, ``story`` is not
and diverges under sampling), every notebook rendered, with the sign-off's evidence on
(paired timing, noise floor, coupling), so each sentence the pages can show is shown.
No page may carry a dataframe repr (``shape: (``), a Python dict (``{'``) or a script
tag; the index states the margin, N per split and each verdict's reason; the sign-off and
choose-setting pages state the absolute accuracy beside the delta.

The batch is computed once per test session and shared with ``test_report_browser.py``.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from relaxspec_audit import batch
from relaxspec_audit.collect.config import EMBEDDED_DIR
from relaxspec_audit.report import format as fmt
from relaxspec_audit.report.format import pct

#: What no report page may contain (case-insensitive): a polars repr, a Python dict repr,
#: a script element.
FORBIDDEN = ("shape: (", "{'", "<script")

_RULES = [
    {"rule": "target", "temperature": 0},
    {"rule": "exact", "temperature": 1.0},
    {"rule": "nucleus", "theta": [0.8, 0.95], "temperature": 1.0},
    {"rule": "greedy"},
    {"rule": "asd", "budget": [2.0, 8.0], "gate": 0.25, "cap": 2},
]

_SHARED: dict[str, object] = {}


def demo_like_batch(tmp_path_factory) -> batch.BatchResult:
    """The demo's shape (both tasks, every notebook, all evidence) at a small size."""
    if "result" not in _SHARED:
        tmp = tmp_path_factory.mktemp("pages")
        config = {
            "batch": "pages",
            "defaults": {
                "limit": 6, "k": 4, "max_new_tokens": 16, "seed": 0, "device": "cpu",
                "timing": {"items": 2, "repeats": 2},
                "noise_floor": {"batch_size": 1, "limit": 2},
                "coupling": {"seed": 1, "limit": 4},
            },
            "notebooks": list(batch.NOTEBOOKS),
            "parameters": {"ni_margin": 0.1},
            "tasks": [
                {"task": task, "splits": ["discovery", "confirmation"], "rules": _RULES}
                for task in ("arith", "story")
            ],
        }  # fmt: skip
        _SHARED["result"] = batch.run_batch(
            config, out=tmp / "reports", runs=tmp / "runs", progress=False
        )
    return _SHARED["result"]  # type: ignore[return-value]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    if not (EMBEDDED_DIR / "target" / "config.json").exists():
        pytest.skip(f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)")
    return demo_like_batch(tmp_path_factory)


def _html_pages(result) -> list:
    return [result.index, *sorted(result.report_dir.glob("*/*.html"))]


def test_every_page_rendered(pages):
    assert pages.ok, [(t.task, t.errors) for t in pages.tasks]
    names = {p.name for p in _html_pages(pages)}
    assert {f"{nb}.html" for nb in batch.NOTEBOOKS} <= names
    assert any(n.startswith("divergence-") for n in names)


def test_no_page_shows_a_repr_a_dict_or_a_script(pages):
    found = []
    for page in _html_pages(pages):
        text = page.read_text().lower()
        found += [(page.name, bad) for bad in FORBIDDEN if bad.lower() in text]
    assert found == []


def test_index_states_the_terms_and_the_reason(pages):
    index = pages.index.read_text()
    assert "δ = 10 pt" in index and "min gain 1×" in index
    summaries = [json.loads(p.read_text()) for p in sorted(pages.report_dir.glob("*/summary.json"))]
    for s in summaries:
        for fam in s["families"]:
            n = [fam[split]["n_requests"] for split in ("discovery", "confirmation")]
            assert f"{n[0]} / {n[1]}" in index
            assert fam["reasons"]
    # Each verdict's deciding reason sits under its badge, as one short sentence.
    reasons = re.findall(r'<span class="reason">([^<]*)</span>', index)
    assert len(reasons) == sum(len(s["families"]) for s in summaries)
    assert all(r.endswith((".", "…")) and len(r) <= 141 for r in reasons)


def test_signoff_and_choice_show_absolute_accuracy(pages):
    summary = json.loads((pages.report_dir / "arith" / "summary.json").read_text())
    signoff = (pages.report_dir / "arith" / "signoff.html").read_text()
    choose = (pages.report_dir / "arith" / "choose_setting.html").read_text()
    for fam in summary["families"]:
        conf = fam["confirmation"]
        # The relaxed setting's score and its reference's (score − paired delta).
        shown = f"{pct(conf['score'])} (reference {pct(conf['score'] - conf['accuracy_delta'])})"
        assert shown in signoff and shown in choose
        if fam["chosen"]:  # the why line names the setting in words: "θ = 0.95", "B = 2, …"
            assert re.search(r"why: discovery: fastest non-inferior setting (θ|B) = ", signoff)


def test_tables_are_formatted(pages):
    fidelity = (pages.report_dir / "arith" / "fidelity.html").read_text()
    assert 'class="table-wrap"' in fidelity and "accuracy Δ [95% CI]" in fidelity
    assert " pt [" in fidelity  # deltas in points with their interval
    assert "dtype" not in fidelity.lower() and "&quot;" not in fidelity


# ---------------------------------------------------------------------- the helpers alone


def test_table_html_escapes_and_formats_with_units():
    import polars as pl

    frame = pl.DataFrame(
        {"setting": ["<b>x</b>", "y"], "d": [0.0125, None], "lo": [-0.01, None],
         "hi": [0.03, None], "share": [0.004, 0.5], "s": [1.234, 2.0], "h": [0.5, 1.0]}
    )  # fmt: skip
    out = fmt.table_html(frame, {
        "setting": ("setting", fmt.text), ("d", "lo", "hi"): ("Δ", fmt.pt),
        "share": ("share", fmt.pct), "s": ("speed-up", fmt.times), "h": ("H", fmt.nats),
    })  # fmt: skip
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "<b>" not in out
    assert "+1.2 pt [-1.0, +3.0]" in out and "0.4%" in out and "50.0%" in out
    assert "1.23×" in out and "0.50 nats" in out and '<td class="num">–</td>' in out
    assert "shape" not in out and "str" not in out
    with pytest.raises(ValueError, match=r"^columns: 'nope' is not a column"):
        fmt.table_html(frame, {"nope": ("x", fmt.text)})


def test_reasons_read_as_sentences():
    """A verdict's reason names its setting in words when it is decided (registry symbols),
    so no page ever parses a Python value back out of a sentence."""
    from relaxspec_audit.verify.registry import setting_words

    assert setting_words({"budget": 8.0, "gate": 0.25, "cap": math.inf}) == "B = 8, g = 0.25, M = ∞"
    assert setting_words({"theta": 0.9}) == "θ = 0.9"
    assert not hasattr(fmt, "reason_text") and not hasattr(fmt, "short_reason")
