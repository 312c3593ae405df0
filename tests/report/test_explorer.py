"""The divergence explorer on tiny real runs of the embedded pair (report/explorer.py).

``story`` is sampled open-ended text, so NSD at θ = 0.98 / 0.99 diverges from ``exact`` on
a few of 16 requests within 24 tokens, each at an ``accept_nucleus`` row (THEORY §2.3.4):
a token accepted only by the relaxation, which the page must colour and mark.
"""

from __future__ import annotations

import re

import polars as pl
import pytest

from relaxspec_audit import collect
from relaxspec_audit.audit import divergences as data
from relaxspec_audit.audit.fidelity import first_divergence
from relaxspec_audit.audit.runs import TaskRuns
from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig
from relaxspec_audit.report import explorer

pytestmark = pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)
BASE = dict(task="story", split="discovery", limit=16, max_new_tokens=24, temperature=1.0,
            seed=0, device="cpu")  # fmt: skip
_FIRST = re.compile(r"first divergence at token (\d+)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs/`` with exact and nucleus θ = 0.98, 0.99 on one seed; the run folders by rule."""
    out = tmp_path_factory.mktemp("explorer") / "runs"
    pair = collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")
    dirs = {
        name: collect.collect(RunConfig(rule=rule, params=params, **BASE), out, pair=pair)
        for name, rule, params in (("exact", "exact", None),
                                   ("0.98", "nucleus", {"theta": 0.98}),
                                   ("0.99", "nucleus", {"theta": 0.99}))
    }  # fmt: skip
    return out, dirs


def _n_diverged(rel, ref) -> int:
    req = [logs.scan([d], "requests").collect() for d in (rel, ref)]
    return int(first_divergence(*req, by=[])["diverged"].sum())


def _view(runs, rule="nucleus", split="discovery", **kw):
    return data.divergences(TaskRuns.load(runs[0], "story"), rule, split=split, **kw)


def _page(runs, tmp_path, **kw) -> str:
    return explorer.divergence_page(_view(runs, **kw), tmp_path / "d.html").read_text()


def _sections(page: str) -> list[str]:
    return page.split("<h2>")[1:]


def test_page_shows_diverged_requests_coloured_and_sorted(runs, tmp_path):
    page = _page(runs, tmp_path)
    assert "<script" not in page.lower() and "shape: (" not in page and "{'" not in page
    sections = _sections(page)
    assert [s.split("</h2>")[0] for s in sections] == ["nucleus θ=0.98", "nucleus θ=0.99"]
    for section, key in zip(sections, ("0.98", "0.99"), strict=True):
        n = _n_diverged(runs[1][key], runs[1]["exact"])
        assert n >= 2, "the fixture must diverge on at least two requests"
        firsts = [int(x) for x in _FIRST.findall(section)]
        assert len(firsts) == n == section.count('class="xp-req"')
        assert firsts == sorted(firsts)
        # Each marked token sits at the position its request's line names, on both sides.
        marked = re.findall(r'class="tok [\w-]+ tok-first" title="t=(\d+) ', section)
        assert [int(t) for t in marked] == [f for f in firsts for _ in range(2)]
        # NSD's divergences are its own acceptances: coloured as relaxation-only, marked.
        assert 'class="tok tok-relax tok-first"' in section
        assert ": rule (accept_nucleus" in section
        assert "tok-nolog" not in section  # every emitted token found its position row
    assert "rank = " in page and "H(p) = " in page and "Token text unavailable" not in page


def test_cap_says_how_many_were_left_out(runs, tmp_path):
    sections = _sections(_page(runs, tmp_path, max_requests=1))
    for section, key in zip(sections, ("0.98", "0.99"), strict=True):
        n = _n_diverged(runs[1][key], runs[1]["exact"])
        assert section.count('class="xp-req"') == 1
        assert f"Showing the 1 of {n} diverged requests that diverge earliest; {n - 1} more " \
            "left out." in section  # fmt: skip


def test_token_text_is_escaped(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_texts", lambda tok, ids: ["<script>x"] * len(ids))
    page = _page(runs, tmp_path)
    assert "<script" not in page.lower() and "&lt;script&gt;x</span>" in page


def test_without_a_tokenizer_ids_show_and_the_page_says_so_once(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_load_tokenizer", lambda path: (None, "OSError: <gone>"))
    page = _page(runs, tmp_path)
    assert page.count("Token text unavailable") == 1 and "&lt;gone&gt;" in page
    assert re.search(r">#\d+</span>", page)


def test_request_view_is_one_request_fragment(runs):
    rel, ref = runs[1]["0.98"], runs[1]["exact"]
    rel_req = logs.scan([rel], "requests").collect()
    ref_req = logs.scan([ref], "requests").collect()
    div = first_divergence(rel_req, ref_req, by=[], keep=["request_id"])
    first = div.filter(pl.col("diverged")).sort("first_pos").row(0, named=True)
    view = explorer.request_view(*data.request_pair(rel, ref, first["request_id_rel"]))
    assert view.startswith("<style>") and "<html" not in view and "<script" not in view.lower()
    assert view.count('class="xp-req"') == 1 and f"token {first['first_pos']}:" in view
    same = div.filter(~pl.col("diverged"))["request_id_rel"][0]
    assert "identical outputs" in explorer.request_view(*data.request_pair(rel, ref, same))
    with pytest.raises(ValueError, match="request_id"):
        data.request_pair(rel, ref, "no-such-request")


def test_bad_input_is_refused_by_name(runs, tmp_path):
    with pytest.raises(ValueError, match="rule: 'exact' is not a relaxed rule"):
        _view(runs, "exact")
    with pytest.raises(ValueError, match=r"split 'confirmation'.*nucleus on discovery"):
        _view(runs, "nucleus", split="confirmation")
    with pytest.raises(ValueError, match="max_requests"):
        _page(runs, tmp_path, max_requests=0)


def test_long_outputs_draw_a_window_and_unlogged_runs_are_not_called_numerics():
    from relaxspec_audit.report import explorer

    def output(n):
        return data.Output(
            label="x",
            stop=None,
            tokens=[data.Token(id=i, text=f"t{i}", row=None) for i in range(n)],
        )

    page = explorer._tokens_html(output(1000), 500)
    assert page.count('class="tok ') == 2 * explorer.WINDOW + 1  # bounded, not 1000 spans
    assert f"… {500 - explorer.WINDOW} tokens before" in page
    assert f"… {1000 - 501 - explorer.WINDOW} tokens after" in page
    # A run logged without positions: the divergence is unattributed, and the relaxed
    # output (as long as the reference's) did not "end first".
    pair = data.Pair(item_id="i", sample=0, request_id_rel="i", request_id_ref="i", first_pos=10,
                     attribution=data.UNATTRIBUTED, cause=None, kind=None, score_rel=None,
                     score_ref=None, reference=output(16), relaxed=output(16))  # fmt: skip
    line = explorer._verdict_line(pair)
    assert "unattributed" in line and "ended first" not in line
    short = pair.model_copy(update={"relaxed": output(2)})
    assert "ended first" in explorer._verdict_line(short)
