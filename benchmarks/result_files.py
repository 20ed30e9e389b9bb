"""A benchmark's JSON result and figure, written beside its markdown report under the report's name (issue 12: every
benchmark writes a JSON result and a plot). docs/benchmark-generation.md gets docs/benchmark-generation.json and
docs/benchmark-generation.png; the report links the figure with `image_line`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf_core.artifacts import atomic_write_text  # noqa: E402


def keep_one_setting(path: Path, setting: dict, remedy: str, read_kept=json.loads) -> None:
    """A work dir's record (`path`, JSON) of the setting its kept results were made with: written on first use; a
    later run with another setting is refused (SystemExit naming both, then `remedy`), so kept results are never
    read back as another setting's. `read_kept`: the record's text -> its setting (to accept an older form)."""
    if not path.exists():
        atomic_write_text(path, json.dumps(setting))
    elif read_kept(path.read_text()) != setting:
        raise SystemExit(f"{path.parent} holds the results of {path.read_text().strip()}, not {setting}: {remedy}")


def check_kept_settings(work_dir: Path, settings: dict) -> None:
    """Refuse a work dir whose kept results were made with other settings (another --config or option, e.g.
    reward_modelling.run_settings): read back, they would be reported as this run's. The first run records its
    settings as work_dir/settings.json (`keep_one_setting`)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    remedy = "give another --work-dir, or delete that one to measure again"
    if not (work_dir / "settings.json").exists() and any(work_dir.glob("seed*.json")):
        raise SystemExit(f"{work_dir} keeps results made before benchmarks recorded their settings: {remedy}")
    keep_one_setting(work_dir / "settings.json", json.loads(json.dumps(settings, default=str)), remedy)


def write_json(report: str | Path, result: dict) -> Path:
    """`result` as JSON beside `report` (.json), written atomically; its path."""
    path = Path(report).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=2, default=float) + "\n")
    return path


def figure_axes(panels: int, width: float = 5.5, height: float = 3.6):
    """A matplotlib figure of `panels` side by side (Agg: no display needed) and its axes, one per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False)
    return fig, list(axes[0])


def bars(ax, values: dict[str, float], xlabel: str, title: str) -> None:
    """Horizontal bars, one per named value, top to bottom in the dict's order, each labelled with its value."""
    names = list(values)
    ax.barh(names, [values[n] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        ax.annotate(f" {values[n]:,.0f}" if abs(values[n]) >= 100 else f" {values[n]:.3g}", (values[n], i),
                    va="center", fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.15)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)


def dots(ax, values: dict[str, list[float]], xlabel: str, title: str, point: str = "a seed") -> None:
    """One row per name, top to bottom in the dict's order: each of its values a dot (`point` in the legend) and
    their mean a bar."""
    for i, (name, row) in enumerate(values.items()):
        ax.scatter(row, [i] * len(row), color="tab:blue", alpha=0.6, label=point if i == 0 else None)
        ax.scatter([sum(row) / len(row)], [i], color="k", marker="|", s=300, label="mean" if i == 0 else None)
    ax.set_yticks(range(len(values)), list(values))
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the rows, never over a dot


def save_figure(fig, report: str | Path) -> str:
    """Save `fig` beside `report` (.png) and close it; the markdown line that shows it from the report."""
    import matplotlib.pyplot as plt

    path = Path(report).with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return image_line(report)


def image_line(report: str | Path) -> str:
    """The markdown image that shows the figure beside `report` (a link relative to the report's folder)."""
    return f"![{Path(report).stem}]({Path(report).with_suffix('.png').name})"
