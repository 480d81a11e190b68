"""Draw the benchmark charts (PNG) from one run's `results.json` and `results/scale.json`.

    python benchmarks/charts.py [--from DIR] [--out DIR]

`--from` is a run's directory (`benchmarks/` after `make bench`, the default, or
`benchmarks/reference/`, the committed run); `--out` is where the PNGs go (`benchmarks/charts/`,
git-ignored, by default). The charts in `docs/images/` are drawn from that committed run:
`make bench-charts` redraws them.

- `bench-headlines.png`: ours against deepagents, one panel per headline figure that has a peer;
- `bench-scale.png`: ms per model turn against the number of conversations on disk (from
  `scale.py`'s document: 10 -> 10,000).

Needs matplotlib (in the `bench` extra); it draws headless (`Agg`), never opens a window.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Headline name -> (what it measures, axis label). Figures without a peer are left out of the
# ours-vs-deepagents chart (their own charts or tables show them).
LABELS: dict[str, tuple[str, str]] = {
    "turn_overhead_1k": ("per model turn, 1 KiB write_file", "ms per turn"),
    "turn_overhead_50k": ("per model turn, 50 KiB write_file", "ms per turn"),
    "batch_write_per_call": ("per call, 200 write_file in one message", "ms per call"),
    "batch_read_per_call": ("per call, 200 read_file in one message", "ms per call"),
    "storage_amplification": ("bytes kept per byte written", "\N{MULTIPLICATION SIGN} written"),
    "grep_common_all": ("grep, all 3,200 hits in 10 MiB", "ms"),
    "grep_rare": ("grep, 1 hit (a full scan)", "ms"),
}
OURS = "#2b6cb0"
PEER = "#a0aec0"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _number(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _save(fig: Any, path: Path) -> None:
    # No "Software" stamp: the same figures give the same bytes whatever matplotlib drew them.
    fig.savefig(path, dpi=110, metadata={"Software": None})


def headlines_chart(results: dict[str, Any], path: Path) -> bool:
    """Ours vs deepagents, one small panel per figure (each with its own scale)."""
    shown = [
        name
        for name in LABELS
        if results.get(name, {}).get("ours") is not None
        and results.get(name, {}).get("peer") is not None
    ]
    if not shown:
        return False
    plt = _pyplot()
    columns = 4
    rows = (len(shown) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(3.1 * columns, 2.9 * rows), squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(shown):
            ax.axis("off")
            continue
        name = shown[index]
        figure = results[name]
        what, unit = LABELS[name]
        values = [figure["ours"], figure["peer"]]
        bars = ax.bar(["ours", "deepagents"], values, color=[OURS, PEER], width=0.6)
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(
                _number(value),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylim(0, max(values) * 1.18)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
        ratio = figure.get("ratio")
        times = "\N{MULTIPLICATION SIGN}"
        less = f"{ratio:.1f}{times} less" if ratio >= 1 else f"{1 / ratio:.1f}{times} more"
        ax.set_title(f"{name}\n{what}\nours: {less}", fontsize=8)
    fig.suptitle("atmosphere-harness vs deepagents (lower is better)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def scale_chart(scale: dict[str, Any], path: Path) -> bool:
    """ms per model turn (median, p90, new and existing conversations) against conversations."""
    levels = sorted(scale.get("levels", {}), key=int)
    if not levels:
        return False
    plt = _pyplot()
    xs = [int(level) for level in levels]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = (
        ("ms_per_turn", "median", OURS, "-", "o"),
        ("ms_per_turn_p90", "p90", OURS, ":", "^"),
        ("ms_per_turn_new", "new conversations", "#38a169", "--", "s"),
        ("ms_per_turn_existing", "existing conversations", "#dd6b20", "--", "D"),
    )
    for key, label, color, style, marker in series:
        ys = [scale["levels"][level][key] for level in levels]
        ax.plot(xs, ys, style, color=color, marker=marker, label=label, markersize=5)
    for x, level in zip(xs, levels, strict=True):
        value = scale["levels"][level]["ms_per_turn"]
        ax.annotate(f"{value:.3f}", (x, value), textcoords="offset points", xytext=(0, -14),
                    ha="center", fontsize=8, color=OURS)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:,}" for x in xs])
    ax.minorticks_off()
    ax.set_ylim(0, None)
    ax.set_xlabel("conversations on disk")
    ax.set_ylabel("ms per model turn (over HTTP)")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    ax.set_title("Cost of a turn as conversations pile up (scale.py)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def draw(source: Path, out: Path) -> list[Path]:
    """Every chart whose data `source` holds, written to `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    results_file = source / "results.json"
    if results_file.exists():
        results = json.loads(results_file.read_text(encoding="utf-8"))
        if headlines_chart(results, out / "bench-headlines.png"):
            written.append(out / "bench-headlines.png")
    scale_file = source / "results" / "scale.json"
    if scale_file.exists():
        scale = json.loads(scale_file.read_text(encoding="utf-8"))
        if scale_chart(scale, out / "bench-scale.png"):
            written.append(out / "bench-scale.png")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", type=Path, default=HERE, help="a run's directory")
    parser.add_argument("--out", type=Path, default=HERE / "charts", help="where the PNGs go")
    args = parser.parse_args()
    for path in draw(args.source, args.out):
        print(path)


if __name__ == "__main__":
    main()
