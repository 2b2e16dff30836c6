"""The figure of a class-incremental run: accuracy on all classes seen so far after each task,
for the method and its baselines."""

from __future__ import annotations

from pathlib import Path


def plot_incremental(result: dict, path: Path, title: str) -> None:
    """Write a PNG of ``A_i`` per task for every method in ``result`` (and its baselines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {_label(result): result}
    runs.update({name: run for name, run in result.get("baselines", {}).items()})
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        after = run["accuracy_after_each_task"]
        ax.plot(range(1, len(after) + 1), [100 * a for a in after], marker="o", label=name)
    ax.set_xlabel("task (classes learnt so far)")
    ax.set_ylabel("accuracy on seen classes (%)")
    ax.set_ylim(0, 100)
    ax.set_xticks(range(1, len(result["accuracy_after_each_task"]) + 1))
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label(result: dict) -> str:
    config = result.get("config", {})
    parts = [result.get("method", "method")]
    if config.get("method") == "icarl":
        parts.append(f"{config['selection']}, {config['memory']} x {config['exemplar_dtype']}")
    return " ".join([parts[0], f"({parts[1]})"]) if len(parts) > 1 else parts[0]
