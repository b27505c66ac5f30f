"""Latency histogram PNG (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from pathlib import Path

from ordq.spark_order_check.report import NONPOSITIVE_BIN, Report, bin_high_us, bin_low_us


def latency_histogram_png(hist: list[tuple[str, str, int, int]], path: Path, report: Report) -> None:
    """One step line per (queue, subscription) over log-spaced bins (20 per decade), in ms."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    series: dict[tuple[str, str], dict[int, int]] = {}
    nonpositive = 0
    for q, s, b, n in hist:
        if b == NONPOSITIVE_BIN:
            nonpositive += n
            continue
        series.setdefault((q, s), {})[b] = n
    for (q, s), bins in sorted(series.items()):
        lo, hi = min(bins), max(bins)
        edges = [float(bin_low_us(b) or 0.0) / 1000 for b in range(lo, hi + 1)] + [bin_high_us(hi) / 1000]
        counts = [bins.get(b, 0) for b in range(lo, hi + 1)]
        ax.stairs(counts, edges, label=f"{q}/{s}")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (deliver_us - msg_us)")
    ax.set_ylabel("deliveries")
    title = "ordq end-to-end latency"
    if len(report.subscriptions) == 1:
        lat = report.subscriptions[0].latency
        if lat.p50_us is not None and lat.p95_us is not None and lat.p99_us is not None and lat.max_us is not None:
            title += (f": p50 {lat.p50_us / 1000:.2f} ms, p95 {lat.p95_us / 1000:.2f} ms, "
                      f"p99 {lat.p99_us / 1000:.2f} ms, max {lat.max_us / 1000:.2f} ms")
    if nonpositive:
        title += f" ({nonpositive} rows <= 0 not shown)"
    ax.set_title(title, fontsize=10)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))
