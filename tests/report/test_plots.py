"""Figures: every plot draws the frame it is given, with labelled axes, and survives empties.

Frames come from the real statistics (``stats``) over ``_synthetic.make_run`` logs and from
``audit.audit_table`` over fixture runs; the checks read back what matplotlib drew (the
plotted values are the frame's, axes carry units, the figure fits a report page).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pytest
from _synthetic import make_run
from test_batch import fake_collect, small_config

from relaxspec_audit import audit as stats
from relaxspec_audit import batch
from relaxspec_audit.report import plots

THETAS = (0.5, 0.8, 0.9, 0.95)


@pytest.fixture(scope="module")
def positions():
    return make_run(n_requests=12, rounds=6, k=4, seed=3)["positions"]


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plots")
    data = small_config(tmp)
    data["tasks"][0]["splits"] = ["discovery"]  # one split is enough to draw every figure
    plan = batch.load_config(data)
    for config in plan.all_runs():
        fake_collect(config.to_json(), str(tmp / "runs"), 1)
    return stats.audit_table(tmp / "runs", "arith", ni_margin=0.1)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _check_axes(fig, n_axes=1):
    axes = fig.get_axes()
    assert len(axes) == n_axes
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel(), "both axes need a label"
    w, h = fig.get_size_inches()
    assert w <= plots.WIDTH + 1e-9 and 2 <= h <= 12  # readable at report width


def test_rejected_in_nucleus_plots_the_fractions(positions):
    anatomy = stats.rejection_anatomy(positions, THETAS)
    fig = plots.rejected_in_nucleus(anatomy)
    _check_axes(fig)
    ax = fig.get_axes()[0]
    (line,) = ax.get_lines()
    expected = anatomy.filter(pl.col("measure") == "nucleus").sort("theta")
    np.testing.assert_allclose(line.get_xdata(), THETAS)
    np.testing.assert_allclose(line.get_ydata(), expected["fraction"].to_numpy() * 100)
    assert "%" in ax.get_ylabel() and "θ" in ax.get_xlabel()


def test_topk_and_rank_histogram(positions):
    anatomy = stats.rejection_anatomy(positions, THETAS)
    fig = plots.topk_share(anatomy)
    _check_axes(fig)
    heights = [p.get_height() for p in fig.get_axes()[0].patches]
    expected = anatomy.filter(pl.col("measure") == "topk").sort("k")["fraction"].to_numpy() * 100
    np.testing.assert_allclose(heights, expected)
    fig = plots.rank_histogram(positions, max_rank=10)
    _check_axes(fig)
    counts = sum(p.get_height() for p in fig.get_axes()[0].patches)
    rejected = positions.filter(
        (pl.col("kind") == "draft") & (pl.col("cause") != "not_reached") & ~pl.col("passed_ratio")
    )
    assert counts == rejected.height  # every rejection is in one bar (ranks > 10 lumped)


def test_entropy_and_acceptance(positions):
    gaps = stats.entropy_gaps(positions)
    fig = plots.entropy_gaps(gaps)
    _check_axes(fig)
    assert "nats" in fig.get_axes()[0].get_ylabel()
    acc = stats.acceptance_by_position(positions).with_columns(pl.lit("exact").alias("setting"))
    fig = plots.acceptance_by_position(acc)
    _check_axes(fig)
    (line,) = fig.get_axes()[0].get_lines()
    np.testing.assert_allclose(line.get_ydata(), acc.sort("pos")["accept_rate"].to_numpy() * 100)


def test_fidelity_figures(audit):
    relaxed = audit.filter(~pl.col("is_reference"))
    for fig in (
        plots.accuracy_deltas(audit, ni_margin=0.1),
        plots.divergence(audit),
        plots.bound_vs_measured(audit),
        plots.frontier(audit.filter(pl.col("split") == "discovery"), ni_margin=0.1),
    ):
        _check_axes(fig)
    fig = plots.accuracy_deltas(audit, ni_margin=0.1)
    ax = fig.get_axes()[0]
    assert len(ax.get_yticklabels()) == relaxed.height
    # The −δ line sits at −100·δ points.
    assert any(np.allclose(line.get_xdata(), -10.0) for line in ax.get_lines())


def _label_boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.get_axes()[0]
    return ax, [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]


def test_frontier_rings_and_labels_the_chosen_setting(audit):
    disc = audit.filter(pl.col("split") == "discovery")
    fig = plots.frontier(disc, ni_margin=0.1, chosen=["nucleus θ=0.8"])
    ax, boxes = _label_boxes(fig)
    texts = [t for t, _ in boxes]
    # The series names the rule, so a point's label is its parameters only.
    assert "θ=0.8" in texts
    assert len(ax.collections) >= 1  # the ring (scatter) around the chosen point


def test_frontier_labels_never_overlap_and_stay_inside(audit):
    disc = audit.filter(pl.col("split") == "discovery")
    # Every setting ringed: the most labels the figure can be asked for.
    fig = plots.frontier(disc, ni_margin=0.1, chosen=disc["setting"].to_list())
    ax, boxes = _label_boxes(fig)
    frame = ax.get_window_extent()
    assert boxes, "the chosen points are labelled"
    for i, (_, a) in enumerate(boxes):
        assert frame.x0 <= a.x0 and a.x1 <= frame.x1 and frame.y0 <= a.y0 and a.y1 <= frame.y1
        for _, b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    # The legend names each rule once and the references once (not one entry per setting).
    (legend,) = fig.legends
    names = [t.get_text() for t in legend.get_texts()]
    assert len(names) == len(set(names))
    assert "reference rule" in names and sum(" vs " in n for n in names) == 2


def test_small_shares_get_a_zoomed_axis(audit):
    relaxed = audit.filter(~pl.col("is_reference") & pl.col("divergence").is_not_null())
    # Shares of a few tenths of a percent: on a 0–100 % axis they would not show at all.
    tiny = relaxed.with_columns(
        pl.lit(0.002).alias("divergence"),
        pl.lit(0.0).alias("divergence_ci_low"),
        pl.lit(0.006).alias("divergence_ci_high"),
    )
    ax = plots.divergence(tiny).get_axes()[0]
    assert ax.get_xlim()[1] == 1.0  # 0.6 % × 1.15 fits under 1 %
    assert "zoomed" in ax.get_xlabel()
    ax = plots.divergence(relaxed.with_columns(pl.lit(0.9).alias("divergence_ci_high")))
    assert ax.get_axes()[0].get_xlim()[1] == 100.0  # large shares keep the full scale


def test_legend_lists_only_visible_series(positions):
    acc = stats.acceptance_by_position(positions)
    # Two settings with the very same curve: one line, one legend entry naming both.
    twins = pl.concat([acc.with_columns(pl.lit(name).alias("setting")) for name in ("a", "b")])
    other = acc.with_columns(pl.lit("c").alias("setting"), pl.col("accept_rate") * 0.5)
    fig = plots.acceptance_by_position(pl.concat([twins, other.select(twins.columns)]))
    ax = fig.get_axes()[0]
    assert len(ax.get_lines()) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a = b", "c"]


@pytest.mark.parametrize(
    "draw",
    [
        lambda: plots.rejected_in_nucleus(stats.rejection_anatomy(_no_rejections(), THETAS)),
        lambda: plots.rank_histogram(_no_rejections()),
        lambda: plots.first_divergence(
            pl.DataFrame(
                schema={"diverged": pl.Boolean, "first_pos": pl.Int64, "setting": pl.String}
            )
        ),
    ],
)
def test_empty_frames_draw_a_message(draw):
    fig = draw()
    ax = fig.get_axes()[0]
    assert ax.texts, "an empty figure says why it is empty"


def _no_rejections():
    pos = make_run(n_requests=3, rounds=2, k=3, seed=1)["positions"]
    return pos.with_columns(pl.lit(True).alias("passed_ratio"))
