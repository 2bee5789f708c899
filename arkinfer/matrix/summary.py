"""summary.md (a table a person reads) and summary.png (decode tokens/s, measured vs predicted).

    paths, notes = write_summary(folder, index)

The plot needs matplotlib (the [plot] or [dev] extra); without it summary.md says so and the
run goes on. Numbers come from index.json only, so a merged CI index renders the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MARKDOWN_NAME = "summary.md"
PLOT_NAME = "summary.png"
_MARK = {"built": "✅ built", "up_to_date": "✅ up to date", "skipped": "⏭ skipped",
         "refused": "⛔ refused", "failed": "❌ failed", "pending": "… pending"}


def _num(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _cell_text(text: str | None) -> str:
    return "" if not text else text.replace("|", "\\|").replace("\n", " ")


def counts(index: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in index["cells"]:
        out[e["status"]] = out.get(e["status"], 0) + 1
    return out


def markdown(index: dict[str, Any], plot_note: str | None) -> str:
    """The summary as markdown: totals, one row per cell, then each reason and next step."""
    c = counts(index)
    lines = [f"# {index['model']}: {len(index['cells'])} cells", "",
             ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(c.items())), "",
             f"ArkInfer {index['arkinfer_version']}, source `{index['source']}`, bench "
             f"`{' '.join(index['bench_args']) or '(defaults)'}`, updated {index['updated']}.", "",
             "| cell | status | backend | weights MiB | top-1 | KL | ppl Δ | decode t/s | "
             "predicted here | predicted on device | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in index["cells"]:
        m = (e["verify"] or {}).get("metrics") or {}
        d = e["decode"] or {}
        size = e["sizes"]["weights_bytes"] / 2**20 if e["sizes"] else None
        lines.append("| " + " | ".join([
            f"`{e['name']}`", _MARK[e["status"]], e["backend"] or "-", _num(size, ".2f"),
            _num(m.get("top1_agreement"), ".3f"), _num(m.get("mean_kl"), ".4f"),
            "-" if m.get("ppl_delta") is None else f"{m['ppl_delta']:+.1%}",
            _num(d.get("measured_ts")), _num(d.get("predicted_ts")),
            _num(d.get("predicted_device_ts")), _num(e["seconds"]["total"])]) + " |")
    notes = [e for e in index["cells"] if e["reason"] or e["hint"]]
    if notes:
        lines += ["", "## Reasons", ""]
        for e in notes:
            hint = f" Next step: {_cell_text(e['hint'])}" if e["hint"] else ""
            lines.append(f"- `{e['name']}` ({e['status'].replace('_', ' ')}): "
                         f"{_cell_text(e['reason']).rstrip('.')}.{hint}")
    lines += ["", "Decode t/s is the bench's first generation test on the machine that built the "
              "cell; *predicted here* is the latency model's roofline for that machine "
              "(`arkinfer doctor`), *predicted on device* the target's at 4096 tokens of context."]
    if plot_note:
        lines += ["", f"Plot: {plot_note}"]
    return "\n".join(lines) + "\n"


def write_plot(index: dict[str, Any], path: Path) -> Path | None:
    """Horizontal bars per cell: measured and predicted decode tokens/s (log scale: the roofline
    is far above an eager CPU runtime). None when no cell has a decode measurement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [e for e in index["cells"] if e["decode"]]
    if not cells:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(cells)), dpi=110)
    ys = range(len(cells))
    measured = [e["decode"]["measured_ts"] for e in cells]
    predicted = [e["decode"]["predicted_ts"] or 0 for e in cells]
    ax.barh([y - 0.2 for y in ys], measured, height=0.4, label="measured here")
    ax.barh([y + 0.2 for y in ys], predicted, height=0.4, label="predicted here (roofline)")
    ax.set_yticks(list(ys), [e["name"] for e in cells])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("decode tokens / s")
    ax.set_title(f"{index['model']}: decode speed per cell, measured vs predicted")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 1.0 / (2 + len(cells))), ncol=2,
              frameon=False)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def write_summary(folder: Path, index: dict[str, Any]) -> tuple[list[Path], str | None]:
    """Write summary.png (when matplotlib is installed) and summary.md into `folder`; returns
    the paths written and a note when the plot was left out."""
    written: list[Path] = []
    note = None
    try:
        plot = write_plot(index, folder / PLOT_NAME)
    except ImportError:
        plot, note = None, ("not drawn: matplotlib is not installed "
                            "(pip install 'arkinfer[plot]')")
    if plot is not None:
        written.append(plot)
        note = f"[{PLOT_NAME}]({PLOT_NAME})"
    elif note is None:
        note = "no cell has a decode measurement yet"
    md = folder / MARKDOWN_NAME
    md.write_text(markdown(index, note), encoding="utf-8")
    return [md, *written], (note if plot is None else None)
