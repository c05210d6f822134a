"""Large-batch study: does LARS hold accuracy where SGD loses it?

Claim tested (Jia et al., arXiv:1807.11205; You et al., arXiv:1708.03888):
with the same model and epoch budget, going from a small batch B to 16-32x B
costs SGD (linear learning-rate scaling + warmup) accuracy, while LARS
(warmup + polynomial decay) holds it.

Every configuration is one `keras-largebatch-train` run in its own process
(same model, data, image size, epochs, warmup, weight decay, seed); only
the batch, the optimizer and the peak rate differ. Prints a Markdown table
and writes `bench/results/large_batch_study.json` and `.png`.

    python bench/large_batch_study.py                 # the study (~24 min, loaded 2-core CPU)
    python bench/large_batch_study.py --epochs 1 --small_batch 16 \
        --large_batch 256 --steps_per_epoch 2 \
        --out /tmp/smoke.json                         # a smoke run
"""

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def one_run(model_dir, batch, optimizer, args, base_lr):
    cmd = [
        sys.executable, "-c",
        "from keras_largebatch.train.main import run; run()",
        f"--model_dir={model_dir}", f"--model={args.model}",
        f"--dataset={args.dataset}", f"--global_batch_size={batch}",
        f"--optimizer={optimizer}", f"--epochs={args.epochs}",
        f"--warmup_epochs={args.warmup_epochs}", "--verbose=0",
        f"--base_learning_rate={base_lr}", f"--lr_scaling={args.lr_scaling}",
        f"--seed={args.seed}",
    ]
    if args.steps_per_epoch:
        cmd.append(f"--steps_per_epoch={args.steps_per_epoch}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(model_dir, "history.csv")) as f:
        rows = list(csv.DictReader(f))
    summary["val_accuracy_per_epoch"] = [float(r["val_accuracy"]) for r in rows]
    summary["train_loss_per_epoch"] = [float(r["loss"]) for r in rows]
    summary["process_seconds"] = time.perf_counter() - start
    return summary


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for r in results:
        style = "-" if r["optimizer"] == "sgd" else "--"
        ax.plot(range(1, len(r["val_accuracy_per_epoch"]) + 1),
                r["val_accuracy_per_epoch"], style, marker="o",
                label=f"{r['optimizer']}, batch {r['global_batch_size']}, "
                      f"peak lr {r['peak_learning_rate']:.3g}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{results[0]['model']} on {results[0]['dataset']}, "
                 f"{results[0]['epochs']} epochs, {results[0]['backend']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="alexnet_bn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup_epochs", type=float, default=1.0)
    parser.add_argument("--small_batch", type=int, default=16)
    parser.add_argument("--large_batch", type=int, default=256)
    parser.add_argument("--sgd_base_lr", type=float, default=0.1)
    parser.add_argument("--lars_base_lr", type=float, default=2.0)
    parser.add_argument("--lr_scaling", default="linear")
    parser.add_argument("--steps_per_epoch", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(
        RESULTS, "large_batch_study.json"))
    args = parser.parse_args()

    results = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (args.small_batch, args.large_batch):
            for optimizer, base_lr in (("sgd", args.sgd_base_lr),
                                       ("lars_mixed", args.lars_base_lr)):
                model_dir = os.path.join(tmp, f"{optimizer}_{batch}")
                r = one_run(model_dir, batch, optimizer, args, base_lr)
                results.append(r)
                print(f"done: {optimizer} batch {batch} "
                      f"val_accuracy {r['val_accuracy']:.4f}", flush=True)

    print()
    print(f"{results[0]['model']} on {results[0]['dataset']}, "
          f"{args.epochs} epochs, backend {results[0]['backend']}, "
          f"{platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs")
    print()
    print("| optimizer | global batch | steps | peak lr | val accuracy "
          "| best epoch acc | images/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        steps = args.epochs * (args.steps_per_epoch or -(
            -r["num_train"] // r["global_batch_size"]))
        r["steps"] = steps
        print(f"| {r['optimizer']} | {r['global_batch_size']} | {steps} | "
              f"{r['peak_learning_rate']:.4g} | {r['val_accuracy']:.4f} | "
              f"{max(r['val_accuracy_per_epoch']):.4f} | "
              f"{r['images_per_sec'] or 0:.1f} |")
    record = {
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    plot(results, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
