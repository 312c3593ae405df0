"""Matplotlib figures of the audit, drawn from the tidy frames of ``stats`` and ``report``.

Each function takes a frame, draws one figure sized for a report page (about 7.5 × 3.6
inches at 100 dpi, ≥ 9 pt text), labels both axes with units, and returns the
``Figure``; none computes a statistic (intervals come with the frame). In a notebook the
inline backend shows the figure at the end of the cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Report-width figure size in inches (about 750 px at 100 dpi).
WIDTH, HEIGHT = 7.5, 3.6
_STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
}


def _figure(height: float = HEIGHT, ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    plt.rcParams.update(_STYLE)
    return plt.subplots(1, ncols, figsize=(WIDTH, height), layout="constrained")


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _err(frame: Any, est: str, lo: str, hi: str, scale: float = 1.0) -> tuple[Any, Any, Any]:
    """Estimate and asymmetric error bars (NaN where the interval is missing)."""
    import numpy as np

    y = frame[est].cast(float).to_numpy() * scale
    low = frame[lo].cast(float).fill_null(float("nan")).to_numpy() * scale
    high = frame[hi].cast(float).fill_null(float("nan")).to_numpy() * scale
    yerr = np.vstack([np.clip(y - low, 0, None), np.clip(high - y, 0, None)])
    return y, np.nan_to_num(yerr), (low, high)


_SHARE_TOPS = (0.5, 1, 2, 5, 10, 20, 50)


def _share_top(*highs: Any) -> float:
    """Upper end (in %) of a share axis: 100, or zoomed so shares under 1 % are visible.

    The smallest of 0.5, 1, 2, 5, 10, 20, 50 % above 1.15 × the largest value (interval
    ends included), else 100.
    """
    import numpy as np

    values = [np.asarray(h, dtype=float).ravel() for h in highs]
    finite = np.concatenate(values) if values else np.array([])
    finite = finite[np.isfinite(finite)]
    top = float(finite.max()) if finite.size else 0.0
    return next((t for t in _SHARE_TOPS if top * 1.15 <= t), 100.0)


def _zoomed(label: str, top: float) -> str:
    """An axis label that says when the share axis does not run to 100 %."""
    return label if top >= 100 else f"{label}\n(axis zoomed to 0–{top:g}%)"


def _distinct(series: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Series with identical data merged into one, their labels joined.

    Two settings with the same curve draw one line; listing both in a legend would name
    a series hidden behind the other.
    """
    import numpy as np

    out: list[tuple[list[str], Any]] = []
    for label, data in series:
        arrays = [np.asarray(a, dtype=float) for a in data]
        for labels, other in out:
            same = len(other) == len(arrays) and all(
                a.shape == b.shape and np.allclose(a, b, equal_nan=True)
                for a, b in zip(arrays, other, strict=True)
            )
            if same:
                labels.append(label)
                break
        else:
            out.append(([label], arrays))
    return [(" = ".join(labels), data) for labels, data in out]


def rejected_in_nucleus(anatomy: Any, by: str | None = None) -> Any:
    """Share of ratio-test rejections inside the θ nucleus vs θ (THEORY §3), with CI band.

    Args:
        anatomy: ``stats.rejection_anatomy`` output (``measure == "nucleus"`` rows used).
        by: optional column with one line per value (e.g. ``rule``).
    """
    import polars as pl

    fig, ax = _figure()
    nuc = anatomy.filter(pl.col("measure") == "nucleus").sort("theta")
    if nuc.height == 0:
        _empty(ax, "no rejected drafts")
        return fig
    groups = nuc.partition_by(by, as_dict=True, maintain_order=True) if by else {("",): nuc}
    series = []
    for key, part in groups.items():
        x = part["theta"].to_numpy()
        y = part["fraction"].to_numpy() * 100
        lo = part["ci_low"].fill_null(float("nan")).to_numpy() * 100
        hi = part["ci_high"].fill_null(float("nan")).to_numpy() * 100
        series.append((str(key[0]), (x, y, lo, hi)))
    series = _distinct(series)
    for name, (x, y, lo, hi) in series:
        (line,) = ax.plot(x, y, marker="o", label=name or None)
        ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)
    top = _share_top(nuc["fraction"] * 100, nuc["ci_high"].fill_null(0.0) * 100)
    ax.set_xlabel("θ (nucleus mass threshold, probability mass)")
    ax.set_ylabel(_zoomed("rejected drafts inside N_θ (%)", top))
    ax.set_ylim(0, top)
    ax.set_title("Drafts the exact rule rejects that NSD at θ would accept")
    if by and len(series) > 1:
        ax.legend(title=by)
    return fig


def topk_share(anatomy: Any) -> Any:
    """Share of ratio-test rejections in the target's top-k (THEORY §3), with CI bars."""
    import polars as pl

    fig, ax = _figure(height=2.8)
    top = anatomy.filter(pl.col("measure") == "topk").sort("k")
    if top.height == 0:
        _empty(ax, "no rejected drafts")
        return fig
    y, yerr, _ = _err(top, "fraction", "ci_low", "ci_high", 100)
    labels = [f"top {k}" for k in top["k"].to_list()]
    ax.bar(labels, y, yerr=yerr, capsize=4, color="#4c72b0")
    top = _share_top(y + yerr[1])
    ax.set_xlabel("target rank cut-off (rank under p)")
    ax.set_ylabel(_zoomed("rejected drafts (%)", top))
    ax.set_ylim(0, top)
    ax.set_title("Rejected drafts in the target's top k")
    return fig


def rank_histogram(positions: Any, max_rank: int = 20) -> Any:
    """Histogram of the target rank of drafts rejected by the ratio test.

    Args:
        positions: ``positions`` table (frame or lazy frame) of the runs to show.
        max_rank: ranks above this are drawn in one last bar labelled ``>max_rank``.
    """
    import numpy as np
    import polars as pl

    fig, ax = _figure()
    lf = positions.lazy() if isinstance(positions, pl.DataFrame) else positions
    ranks = (
        lf.filter(
            (pl.col("kind") == "draft")
            & (pl.col("cause") != "not_reached")
            & ~pl.col("passed_ratio")
        )
        .select("rank")
        .collect()["rank"]
        .to_numpy()
    )
    if len(ranks) == 0:
        _empty(ax, "no rejected drafts")
        return fig
    clipped = np.minimum(ranks, max_rank + 1)
    ax.hist(clipped, bins=np.arange(0.5, max_rank + 2.5), color="#4c72b0", rwidth=0.85)
    ticks = [*[1, 5, 10, 15, 20][: 1 + max_rank // 5], max_rank + 1]
    ax.set_xticks(ticks, [str(t) for t in ticks[:-1]] + [f">{max_rank}"])
    ax.set_xlabel("rank of the rejected draft under the target p (1 = target argmax)")
    ax.set_ylabel("rejected drafts (count)")
    ax.set_title(f"Where rejected drafts rank ({len(ranks)} rejections)")
    return fig


def entropy_gaps(gaps: Any, by: str | None = None) -> Any:
    """Mean draft and target entropy per subset of positions (THEORY §3 entropy gap).

    Args:
        gaps: ``stats.entropy_gaps`` output.
        by: optional grouping column (e.g. ``rule``): one panel row per value is too
            much for a report, so groups become adjacent bar clusters.
    """
    import numpy as np
    import polars as pl

    fig, ax = _figure()
    ent = gaps.filter(
        pl.col("measure").is_in(["entropy_q", "entropy_p"]) & (pl.col("n_positions") > 0)
    )
    if ent.height == 0:
        _empty(ax, "no positions")
        return fig
    keys = ["subset"] if not by else [by, "subset"]
    groups = ent.select(keys).unique(maintain_order=True)
    labels = [" / ".join(str(v) for v in row) for row in groups.iter_rows()]
    x = np.arange(len(labels))
    for i, (measure, name) in enumerate(
        (("entropy_q", "draft H(q)"), ("entropy_p", "target H(p)"))
    ):
        part = groups.join(ent.filter(pl.col("measure") == measure), on=keys, how="left")
        y, yerr, _ = _err(part, "mean", "ci_low", "ci_high")
        ax.bar(x + (i - 0.5) * 0.38, np.nan_to_num(y), 0.38, yerr=yerr, capsize=3, label=name)
    ax.set_xticks(
        x,
        labels,
        rotation=20 if len(labels) > 4 else 0,
        ha="right" if len(labels) > 4 else "center",
    )
    ax.set_ylabel("mean entropy (nats)")
    ax.set_xlabel("positions" if not by else f"{by} / positions")
    ax.set_title("Draft vs target entropy where drafts are rejected or extra-accepted")
    ax.legend()
    return fig


def acceptance_by_position(acc: Any, label: str = "setting") -> Any:
    """Acceptance rate per position in the block, one line per ``label`` value, CI band."""
    fig, ax = _figure()
    if acc.height == 0:
        _empty(ax, "no rounds")
        return fig
    groups = (
        acc.partition_by(label, as_dict=True, maintain_order=True)
        if label in acc.columns
        else {("",): acc}
    )
    series = []
    for key, part in groups.items():
        part = part.sort("pos")
        x = part["pos"].to_numpy() + 1
        y, _, (lo, hi) = _err(part, "accept_rate", "ci_low", "ci_high", 100)
        series.append((str(key[0]), (x, y, lo, hi)))
    series = _distinct(series)
    for name, (x, y, lo, hi) in series:
        (line,) = ax.plot(x, y, marker="o", label=name)
        ax.fill_between(x, lo, hi, alpha=0.07, color=line.get_color(), linewidth=0)
    ax.set_xticks(range(1, int(acc["pos"].max()) + 2))
    ax.set_xlabel("draft position in the block (1 = first)")
    ax.set_ylabel("accepted (% of rounds)")
    ax.set_ylim(0, 100)
    ax.set_title("Acceptance by position")
    if len(series) > 1:
        # Beside the axes: inside, the legend would hide the curves it names.
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def _labels(table: Any) -> list[str]:
    return [
        f"{s} · {sp}" if sp else s for s, sp in zip(table["setting"], table["split"], strict=True)
    ]


def accuracy_deltas(table: Any, ni_margin: float) -> Any:
    """Forest plot of paired accuracy deltas (points) with CI and the line at −δ (THEORY §3).

    Args:
        table: ``audit.audit_table`` rows (relaxed rules; references are skipped).
        ni_margin: non-inferiority margin δ in score units (drawn at −100·δ points).
    """
    import numpy as np
    import polars as pl

    rel = table.filter(~pl.col("is_reference") & pl.col("accuracy_delta").is_not_null())
    fig, ax = _figure(height=max(2.4, 0.45 * rel.height + 1.2))
    if rel.height == 0:
        _empty(ax, "no scored pairs on this split")
        return fig
    y = np.arange(rel.height)[::-1]
    est, err, _ = _err(rel, "accuracy_delta", "delta_ci_low", "delta_ci_high", 100)
    ok = rel["noninferior"].fill_null(False).to_numpy()
    for yi, e, lo, hi, good in zip(y, est, err[0], err[1], ok, strict=True):
        color = "#1a7f37" if good else "#cf222e"
        ax.errorbar(e, yi, xerr=[[lo], [hi]], fmt="o", color=color, capsize=3)
    ax.axvline(0, color="0.3", linewidth=1)
    ax.axvline(
        -100 * ni_margin,
        color="#9a6700",
        linestyle="--",
        linewidth=1,
        label=f"−δ = {-100 * ni_margin:g} pt",
    )
    ax.set_yticks(y, _labels(rel))
    ax.set_xlabel("accuracy delta vs reference (percentage points, 95% CI)")
    ax.set_ylabel("setting · split")
    ax.set_title("Accuracy delta (green: non-inferior at δ)")
    ax.legend(loc="lower right")
    return fig


def divergence(table: Any) -> Any:
    """Hash divergence rate (share of requests whose output differs) with Wilson CI."""
    import numpy as np
    import polars as pl

    rel = table.filter(~pl.col("is_reference") & pl.col("divergence").is_not_null())
    fig, ax = _figure(height=max(2.4, 0.45 * rel.height + 1.2))
    if rel.height == 0:
        _empty(ax, "no relaxed run with a paired reference")
        return fig
    y = np.arange(rel.height)[::-1]
    est, err, _ = _err(rel, "divergence", "divergence_ci_low", "divergence_ci_high", 100)
    ax.barh(y, est, xerr=err, capsize=3, color="#8172b2")
    top = _share_top(est + err[1])
    for yi, e in zip(y, est, strict=True):
        ax.annotate(f"{e:.2g}%" if 0 < e < 1 else f"{e:.1f}%", (0, yi), xytext=(3, 5),
                    textcoords="offset points", fontsize=8, va="bottom")  # fmt: skip
    ax.set_yticks(y, _labels(rel))
    ax.set_xlim(0, top)
    ax.set_xlabel(_zoomed("outputs differing from the reference (% of requests, 95% CI)", top))
    ax.set_ylabel("setting · split")
    ax.set_title("Hash divergence")
    return fig


def first_divergence(first: Any) -> Any:
    """Histogram of the first divergent token position, one series per setting."""
    import polars as pl

    fig, ax = _figure()
    div = first.filter(pl.col("diverged") & pl.col("first_pos").is_not_null())
    if div.height == 0:
        _empty(ax, "no diverged request")
        return fig
    import numpy as np

    top = int(div["first_pos"].max()) + 1
    bins = min(30, max(top, 1))
    series = [
        (str(key[0]), (np.sort(part["first_pos"].to_numpy()),))
        for key, part in div.partition_by("setting", as_dict=True, maintain_order=True).items()
    ]
    for name, (pos,) in _distinct(series):
        ax.hist(pos, bins=bins, range=(0, top), histtype="step", linewidth=1.5, label=name)
    ax.set_xlabel("first divergent token position (0 = first generated token)")
    ax.set_ylabel("diverged requests (count)")
    ax.set_title("Where outputs first differ from the reference")
    ax.legend(fontsize=8)
    return fig


def bound_vs_measured(table: Any) -> Any:
    """Coupling bound ``Π(1 − ε_t)`` vs the measured identical-output rate, per θ (THEORY §2.3)."""
    import numpy as np
    import polars as pl

    rows = table.filter(pl.col("bound").is_not_null() & pl.col("identical_rate").is_not_null())
    rows = rows.filter(~pl.col("is_reference")).sort("value")
    fig, ax = _figure()
    if rows.height == 0:
        _empty(ax, "no NSD run with E_S on its θ grid and a paired exact run")
        return fig
    x = np.arange(rows.height)
    bound = rows["bound"].to_numpy() * 100
    ax.scatter(x - 0.08, bound, marker="_", s=400, linewidths=2.5, color="#4c72b0",
               label="bound mean Π(1 − ε_t)", zorder=3)  # fmt: skip
    est, err, (lo, _) = _err(rows, "identical_rate", "identical_ci_low", "identical_ci_high", 100)
    ax.errorbar(x + 0.08, est, yerr=err, fmt="o", capsize=3, color="#dd8452",
                label="measured identical (95% CI)")  # fmt: skip
    many = rows.height > 3  # long labels side by side would overlap
    ax.set_xticks(x, _labels(rows), rotation=20 if many else 0, ha="right" if many else "center")
    ax.set_xlim(-0.6, rows.height - 0.4)
    # Both sit near 100 %: a 0–100 axis would hide their gap, so the axis starts below them.
    floor = float(np.nanmin(np.concatenate([bound, lo, est])))
    bottom = max(0.0, 5 * np.floor((floor - 2) / 5))
    ax.set_ylim(bottom, 100.5)
    ax.set_ylabel(
        "outputs identical to exact (%)" + (f"\n(axis from {bottom:g}%)" if bottom > 0 else "")
    )
    ax.set_xlabel("setting · split")
    ax.set_title("(1 − ε)^T coupling bound vs measured")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def frontier(table: Any, ni_margin: float | None = None, chosen: Sequence[str] = ()) -> Any:
    """Speed vs fidelity of every setting (THEORY §3 "Choosing θ or a budget").

    x: the modelled speed-up over the reference rule (pass counts × the cost table, a
    function of the logs, so the same logs draw the same point); y: accuracy delta in
    points with CI (or, for a task without a scorer, the share of requests whose output
    is identical to the reference). One line per relaxed rule; the references sit at
    (1, 0), drawn once. Settings in ``chosen`` are ringed. Only the ringed and the Pareto
    points (no other setting both faster and more accurate) are labelled, and only where
    the label overlaps no other label; the page's table names every point.

    Args:
        table: ``audit.audit_table`` rows (one split is clearer).
        ni_margin: non-inferiority margin δ (score units) drawn at −100·δ.
        chosen: setting labels to highlight.
    """
    import numpy as np
    import polars as pl

    fig, ax = _figure(height=4.0)
    rows = table.filter(pl.col("speedup_vs_reference").is_not_null())
    if rows.height == 0:
        _empty(ax, "no settings")
        return fig
    scored = rows["accuracy_delta"].is_not_null().any()
    points: list[tuple[float, float, str, bool, Any]] = []  # x, y, label, ringed, colour
    relaxed = rows.filter(~pl.col("is_reference"))
    for key, part in relaxed.partition_by("rule", as_dict=True, maintain_order=True).items():
        part = part.sort("speedup_vs_reference")
        x = part["speedup_vs_reference"].to_numpy()
        if scored:
            y, yerr, _ = _err(part, "accuracy_delta", "delta_ci_low", "delta_ci_high", 100)
        else:
            y = (1 - part["divergence"].fill_null(0.0).to_numpy()) * 100
            yerr = None
        rule = str(key[0])
        cont = ax.errorbar(x, y, yerr=yerr, fmt="o-", capsize=3, alpha=0.9,
                           label=f"{rule} vs {part['reference'][0]}")  # fmt: skip
        color = cont[0].get_color()
        for xi, yi, name in zip(x, y, part["setting"].to_list(), strict=True):
            short = name[len(rule) + 1 :] if name.startswith(f"{rule} ") else name
            ringed = name in chosen
            points.append((float(xi), float(yi), short, ringed, color))
            if ringed:
                ax.scatter([xi], [yi], s=220, facecolors="none", edgecolors=color,
                           linewidths=2, zorder=5)  # fmt: skip
    if rows["is_reference"].any():
        ax.scatter([1.0], [0.0 if scored else 100.0], marker="s", s=45, color="0.15", zorder=6,
                   label="reference rule")  # fmt: skip
    ax.axvline(1.0, color="0.5", linewidth=1)
    if scored:
        ax.axhline(0, color="0.3", linewidth=1)
        if ni_margin is not None:
            ax.axhline(-100 * ni_margin, color="#9a6700", linestyle="--", linewidth=1,
                       label=f"−δ = {-100 * ni_margin:g} pt")  # fmt: skip
        ax.set_ylabel("accuracy delta vs reference (points, 95% CI)")
    else:
        ax.set_ylabel("outputs identical to the reference (%)")
    ax.set_xlabel("modelled speed-up over the reference rule (×, pass counts × cost table)")
    ax.set_title("Speed vs fidelity frontier")
    # Beside the axes, never over the points.
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    xy = np.array([(p[0], p[1]) for p in points]) if points else np.zeros((0, 2))
    labelled = [
        p
        for i, p in enumerate(points)
        if p[3]
        or not np.any((xy[:, 0] >= xy[i, 0]) & (xy[:, 1] >= xy[i, 1]) & np.any(xy != xy[i], axis=1))
    ]
    _place_labels(fig, ax, sorted(labelled, key=lambda p: (not p[3], -p[0])))
    return fig


# Label offsets tried in turn (points): right/left of the marker, then further up/down.
_OFFSETS = [(6, 6), (6, -12), (-6, 6), (-6, -12), (6, 18), (6, -24), (-6, 18), (-6, -24)]


def _place_labels(fig: Any, ax: Any, points: Sequence[tuple[float, float, str, bool, Any]]) -> None:
    """Annotate points where the label overlaps no placed label and stays inside the axes.

    A label that fits nowhere is left out (the page's table names the point); a
    greedy placement in the order given (ringed points first).
    """
    fig.canvas.draw()  # settles the layout, so window extents are final
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    for x, y, text, ringed, color in points:
        for dx, dy in _OFFSETS:
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                              fontsize=8, color=color, ha="left" if dx > 0 else "right",
                              fontweight="bold" if ringed else "normal")  # fmt: skip
            ann.set_in_layout(False)
            box = ann.get_window_extent(renderer).expanded(1.05, 1.15)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1
                      and box.y0 >= frame.y0 and box.y1 <= frame.y1)  # fmt: skip
            if inside and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            ann.remove()


def run_speed(overview: Any) -> Any:
    """Mean accepted length τ of every run (``audit.runs.runs_overview``), one bar per run."""
    import numpy as np
    import polars as pl

    rows = overview.filter(pl.col("tau_mean").is_not_null())
    fig, ax = _figure(height=max(2.4, 0.3 * rows.height + 1.2))
    if rows.height == 0:
        _empty(ax, "no runs with rounds")
        return fig
    y = np.arange(rows.height)[::-1]
    ax.barh(y, rows["tau_mean"].to_numpy(), color="#55a868")
    ax.set_yticks(y, _labels(rows), fontsize=8)
    ax.set_xlabel("τ: tokens emitted per target pass (mean)")
    ax.set_ylabel("run (setting · split)")
    ax.set_title("Accepted length per run")
    return fig
