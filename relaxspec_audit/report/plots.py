"""Matplotlib figures of the audit, drawn from the tidy frames of ``stats`` and ``report``.

Each function takes a frame, draws one figure sized for a report page (about 7.5 × 3.6
inches at 100 dpi, ≥ 9 pt text), labels both axes with units, and returns the
``Figure``; none computes a statistic (intervals come with the frame). In a notebook the
inline backend shows the figure at the end of the cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from relaxspec_audit._compat import renamed_kwargs

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
    for key, part in groups.items():
        x = part["theta"].to_numpy()
        y = part["fraction"].to_numpy() * 100
        lo = part["ci_low"].fill_null(float("nan")).to_numpy() * 100
        hi = part["ci_high"].fill_null(float("nan")).to_numpy() * 100
        (line,) = ax.plot(x, y, marker="o", label=str(key[0]) or None)
        ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)
    ax.set_xlabel("θ (nucleus mass threshold)")
    ax.set_ylabel("rejected drafts inside N_θ (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Drafts the exact rule rejects that NSD at θ would accept")
    if by:
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
    ax.set_xlabel("target rank cut-off")
    ax.set_ylabel("rejected drafts (%)")
    ax.set_ylim(0, 100)
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
    for key, part in groups.items():
        part = part.sort("pos")
        x = part["pos"].to_numpy() + 1
        y, _, (lo, hi) = _err(part, "accept_rate", "ci_low", "ci_high", 100)
        (line,) = ax.plot(x, y, marker="o", label=str(key[0]))
        ax.fill_between(x, lo, hi, alpha=0.07, color=line.get_color(), linewidth=0)
    ax.set_xticks(range(1, int(acc["pos"].max()) + 2))
    ax.set_xlabel("draft position in the block (1 = first)")
    ax.set_ylabel("accepted (% of rounds)")
    ax.set_ylim(0, 100)
    ax.set_title("Acceptance by position")
    if len(groups) > 1:
        ax.legend(fontsize=8, ncols=2)
    return fig


def _labels(table: Any) -> list[str]:
    return [
        f"{s} · {sp}" if sp else s for s, sp in zip(table["setting"], table["split"], strict=True)
    ]


@renamed_kwargs(margin="ni_margin")
def accuracy_deltas(table: Any, ni_margin: float) -> Any:
    """Forest plot of paired accuracy deltas (points) with CI and the line at −δ (THEORY §3).

    Args:
        table: ``report.audit_table`` rows (relaxed rules; references are skipped).
        ni_margin: non-inferiority margin δ in score units (drawn at −100·δ points).
    """
    import numpy as np
    import polars as pl

    rel = table.filter(~pl.col("is_reference") & pl.col("accuracy_delta").is_not_null())
    fig, ax = _figure(height=max(2.4, 0.45 * rel.height + 1.2))
    if rel.height == 0:
        _empty(ax, "no scored pairs (task without a scorer?)")
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
    ax.set_yticks(y, _labels(rel))
    ax.set_xlim(0, 100)
    ax.set_xlabel("requests whose output differs from the reference (%, 95% CI)")
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
    top = int(div["first_pos"].max()) + 1
    bins = min(30, max(top, 1))
    for key, part in div.partition_by("setting", as_dict=True, maintain_order=True).items():
        ax.hist(part["first_pos"].to_numpy(), bins=bins, range=(0, top), histtype="step",
                linewidth=1.5, label=str(key[0]))  # fmt: skip
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
    ax.bar(x - 0.2, rows["bound"].to_numpy() * 100, 0.4, label="bound mean Π(1 − ε_t)")
    est, err, _ = _err(rows, "identical_rate", "identical_ci_low", "identical_ci_high", 100)
    ax.bar(x + 0.2, est, 0.4, yerr=err, capsize=3, label="measured identical (95% CI)")
    ax.set_xticks(x, _labels(rows))
    ax.set_ylim(0, 105)
    ax.set_ylabel("requests with output identical to exact (%)")
    ax.set_xlabel("setting · split")
    ax.set_title("(1 − ε)^T coupling bound vs measured")
    ax.legend(fontsize=8, loc="lower left")
    return fig


@renamed_kwargs(margin="ni_margin")
def frontier(table: Any, ni_margin: float | None = None, chosen: Sequence[str] = ()) -> Any:
    """Speed vs fidelity of every setting (THEORY §3 "Choosing θ or a budget").

    x: the modelled speed-up over the reference rule (pass counts × the cost table, a
    function of the logs, so the same logs draw the same point); y: accuracy delta in
    points with CI (or, for a
    task without a scorer, the share of requests whose output is identical to the
    reference). References sit at (1, 0). Settings in ``chosen`` are ringed.

    Args:
        table: ``report.audit_table`` rows (one split is clearer).
        ni_margin: non-inferiority margin δ (score units) drawn at −100·δ.
        chosen: setting labels to highlight.
    """
    import polars as pl

    fig, ax = _figure(height=4.0)
    rows = table.filter(pl.col("speedup_vs_reference").is_not_null())
    if rows.height == 0:
        _empty(ax, "no settings")
        return fig
    scored = rows["accuracy_delta"].is_not_null().any()
    for key, part in rows.partition_by("reference", as_dict=True, maintain_order=True).items():
        part = part.sort("speedup_vs_reference")
        x = part["speedup_vs_reference"].to_numpy()
        if scored:
            # References have no interval: draw them as points.
            part = part.with_columns(
                pl.col(c).fill_null(pl.col("accuracy_delta"))
                for c in ("delta_ci_low", "delta_ci_high")
            )
            y, yerr, _ = _err(part, "accuracy_delta", "delta_ci_low", "delta_ci_high", 100)
        else:
            y = (1 - part["divergence"].fill_null(0.0).to_numpy()) * 100
            yerr = None
        cont = ax.errorbar(x, y, yerr=yerr, fmt="o-", capsize=3, label=f"vs {key[0]}", alpha=0.9)
        refs = part["is_reference"].to_list()
        for j, (xi, yi, name) in enumerate(zip(x, y, part["setting"].to_list(), strict=True)):
            # Staggered offsets keep labels of nearby settings apart; references go left.
            offset = (-6, 6) if refs[j] else (4, 4 + 9 * (j % 3))
            ax.annotate(name, (xi, yi), textcoords="offset points", xytext=offset, fontsize=8,
                        ha="right" if refs[j] else "left")  # fmt: skip
            if name in chosen:
                ax.scatter([xi], [yi], s=220, facecolors="none", edgecolors=cont[0].get_color(),
                           linewidths=2, zorder=5)  # fmt: skip
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
    ax.legend(fontsize=8)
    return fig


def run_speed(overview: Any) -> Any:
    """Mean accepted length τ of every run (``report.runs_overview``), one bar per run."""
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
