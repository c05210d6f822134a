"""The files a run reads back and draws outside its checkpoints:
history.csv (Keras' `CSVLogger`, `read_history`) and learning_curves.png
(`plot_learning_curves`, written atomically). Its JSON files go through
the package's one `write_json` (`keras_largebatch._shared`)."""

import csv
import os

from keras_largebatch._shared import atomic_path
from keras_largebatch.train import layout


def read_history(out_dir, history=None):
    """Every epoch's logs of the run, resumed ones included, as {column:
    [float, ...]}: `out_dir`'s history.csv (`CSVLogger`) where this
    process writes it, else this invocation's `history` (a Keras
    `History`; {} without one)."""
    csv_path = os.path.join(out_dir, layout.HISTORY)
    found = {}
    if os.path.exists(csv_path):
        with open(csv_path, newline="") as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    try:
                        found.setdefault(key, []).append(float(value))
                    except (TypeError, ValueError):
                        pass
    if found or history is None:
        return found
    return {"epoch": list(history.epoch), **history.history}


def plot_learning_curves(history, path, title=""):
    """Loss and accuracy per epoch (train and validation), and the update
    batch of each epoch when it grew (`global_batch_size` in the logs),
    PNG via Agg."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    epochs = [int(e) + 1 for e in history.get("epoch", [])]
    batches = history.get("global_batch_size")
    fig, axes = plt.subplots(1, 3 if batches else 2,
                             figsize=(13 if batches else 9, 3.5))
    if batches:
        ax = axes[2]
        ax.step(epochs or range(1, len(batches) + 1), batches, where="mid",
                marker="o")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("epoch")
        ax.set_ylabel("global batch (update)")
        ax.grid(alpha=0.3)
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for key, label in ((metric, "train"), (f"val_{metric}", "validation")):
            if history.get(key):
                ax.plot(epochs or range(1, len(history[key]) + 1),
                        history[key], marker="o", label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)

