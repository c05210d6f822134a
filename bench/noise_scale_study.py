"""Noise-scale study: does the measured B_simple predict the critical batch?

Two measurements on the large-batch study's network and data (ResNet-8 of
width 4 on Fashion-MNIST, SGD with the study's recipe):

1. `--phase measure`: B_simple along training at the small batch (128 by
   default, as `--accumulation` micro-batches), from `fit` with
   `keras_largebatch.GradientNoiseScale`: the model, data and optimizer are
   the ones `keras-largebatch-train` builds (`main.prepare`), the learning
   rate schedule that of the study's best SGD run at 128;
2. `--phase fit` (no training): from the SGD runs already in
   `bench/results/large_batch_study.json`, the steps S(B) to each target
   validation accuracy (the first crossing, interpolated linearly between
   epochs; the fewest over the rates and budgets swept at each batch), and
   the least-squares fit of McCandlish et al.'s `S = S_min (1 + B_crit/B)`
   (linear in 1/B), with B_crit beside the measured B_simple.

It prints a table and writes `<out>.json`.

    python bench/noise_scale_study.py --phase measure --epochs 3
    python bench/noise_scale_study.py --phase fit

Reference: McCandlish et al., 2018, arXiv:1812.06162.
"""

import argparse
import json
import math
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
STUDY = os.path.join(RESULTS, "large_batch_study.json")


def measure(args):
    """B_simple per epoch at `args.batch`, from fit with the callback."""
    import keras

    from keras_largebatch.noise_scale import GradientNoiseScale
    from keras_largebatch.train import main

    study = json.load(open(STUDY))
    a = study["args"]
    config = main.parse([
        "noise_scale_study", f"--model_dir={args.work_dir}",
        f"--model={a['model']}", f"--resnet_depth={a['depth']}",
        f"--resnet_width={a['width']}", f"--dataset={a['dataset']}",
        f"--global_batch_size={args.batch}", "--optimizer=sgd",
        f"--epochs={args.schedule_epochs}", "--lr_scaling=none",
        f"--warmup_epochs={args.warmup_epochs}",
        f"--base_learning_rate={args.rate}", f"--seed={args.seed}",
        f"--weight_decay={a['weight_decay']}",
        f"--label_smoothing={a['label_smoothing']}",
        f"--bn_momentum={a['bn_momentum']}", "--augment=none",
        f"--gradient_accumulation_steps={args.accumulation}",
        "--precision=float32", "--verbose=0",
    ])
    run = main.prepare(config, main.place(config.placement))
    inputs = run.inputs
    # Every update measured: the study's B_simple at full precision.
    gns = GradientNoiseScale(inputs.step_batch, beta=args.beta, interval=1)
    start = time.perf_counter()
    history = run.model.fit(
        inputs.train, validation_data=inputs.validation, epochs=args.epochs,
        steps_per_epoch=inputs.steps_per_epoch, callbacks=[gns], verbose=0,
        shuffle=False)
    h = {k: [float(x) for x in v] for k, v in history.history.items()}
    return dict(
        batch=args.batch, micro_batch=inputs.step_batch,
        accumulation=args.accumulation, rate=args.rate,
        schedule_epochs=args.schedule_epochs, beta=args.beta,
        seed=args.seed, backend=keras.backend.backend(),
        wall_seconds=time.perf_counter() - start, history=h)


def steps_to(curve, target, updates_per_epoch):
    """Updates until `curve` (accuracy per epoch) first reaches `target`,
    interpolated linearly between epochs; None if never."""
    before = 0.0
    for epoch, acc in enumerate(curve):
        if acc >= target:
            fraction = (target - before) / (acc - before) if acc > before \
                else 1.0
            return (epoch + fraction) * updates_per_epoch
        before = acc
    return None


def fit_critical_batch(points):
    """Least squares of S = S_min + S_min * B_crit / B over (B, S)."""
    xs = [1.0 / b for b, _ in points]
    ys = [s for _, s in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    s_min = my - slope * mx
    return s_min, slope / s_min if s_min > 0 else float("nan")


def fit(args):
    runs = []
    for path in args.studies:
        if os.path.exists(path):
            runs += [r for r in json.load(open(path))["runs"]
                     if r["optimizer"] == "sgd"]
    batches = sorted({r["batch"] for r in runs})
    rows = []
    for target in args.targets:
        best = {}
        for r in runs:
            s = steps_to(r["val_accuracy_per_epoch"], target,
                         r["num_train"] / r["batch"])
            if s is not None and (r["batch"] not in best
                                  or s < best[r["batch"]][0]):
                best[r["batch"]] = (s, f"{r['epochs']} ep, rate {r['rate']}")
        points = [(b, best[b][0]) for b in batches if b in best]
        s_min, b_crit = (fit_critical_batch(points) if len(points) >= 2
                         else (None, None))
        residuals = None if s_min is None else [
            s / (s_min * (1 + b_crit / b)) - 1 for b, s in points]
        rows.append(dict(target=target,
                         steps=[[b, *best[b]] for b in batches if b in best],
                         s_min=s_min, b_crit=b_crit, residuals=residuals))
    return dict(batches=batches, rows=rows)


def b_simple_on_the_way(measured, target):
    """(epochs the measuring run took to `target`, B_simple over those
    epochs as the ratio of the mean components, the last epoch's B_simple),
    from the measuring run's own curve."""
    h = measured["history"]
    epochs = steps_to(h["val_accuracy"], target, 1.0)
    if epochs is None:
        return None
    n = math.ceil(epochs)
    trace, grad_sq = h["gns_trace_cov"][:n], h["gns_grad_sq_norm"][:n]
    return epochs, sum(trace) / sum(grad_sq), h["gradient_noise_scale"][n - 1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--phase", choices=["measure", "fit"], default="fit")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--schedule_epochs", type=int, default=8)
    p.add_argument("--warmup_epochs", type=float, default=4 / 9)
    p.add_argument("--rate", type=float, default=0.2)
    p.add_argument("--beta", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--targets", type=float, nargs="+",
                   default=[0.8, 0.85, 0.88, 0.9])
    p.add_argument("--studies", nargs="+", default=[
        STUDY, os.path.join(RESULTS, "noise_scale_sweeps.json")],
        help="study JSONs whose SGD runs give S(B) (missing ones skipped)")
    p.add_argument("--work_dir", default="runs/noise_scale")
    p.add_argument("--out", default=os.path.join(RESULTS, "noise_scale_study"))
    args = p.parse_args()
    path = args.out + ".json"
    result = json.load(open(path)) if os.path.exists(path) else {}
    result.update(machine=f"{platform.machine()}, {os.cpu_count()} CPUs",
                  command="python " + " ".join(sys.argv))
    if args.phase == "measure":
        result["measure"] = measure(args)
    result["fit"] = fit(args)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    report(result)


def report(result):
    m = result.get("measure")
    if m:
        h = m["history"]
        print(f"B_simple at batch {m['batch']} ({m['accumulation']} x "
              f"{m['micro_batch']}), SGD rate {m['rate']}, {m['backend']}:")
        print("epoch  B_simple  |G|^2 est  tr(Sigma) est  val_acc")
        for i, b in enumerate(h["gradient_noise_scale"]):
            print(f"{i + 1:5d}  {b:8.0f}  {h['gns_grad_sq_norm'][i]:9.4f}  "
                  f"{h['gns_trace_cov'][i]:13.1f}  "
                  f"{h.get('val_accuracy', [math.nan] * (i + 1))[i]:.4f}")
    print("\nSGD steps to target (fewest over the swept rates/budgets), "
          "fit S = S_min (1 + B_crit/B), B_simple measured on the way:")
    f = result["fit"]
    print("target  " + "  ".join(f"S({b})" for b in f["batches"])
          + "  S_min  B_crit  max|resid|  epochs  B_simple way/last")
    for row in f["rows"]:
        steps = {b: s for b, s, _ in row["steps"]}
        cells = [f"{steps[b]:.0f}" if b in steps else "-"
                 for b in f["batches"]]
        tail = "-  -  -"
        if row["b_crit"] is not None:
            tail = (f"{row['s_min']:.0f}  {row['b_crit']:.0f}  "
                    f"{max(abs(r) for r in row['residuals']):.0%}")
        way = m and b_simple_on_the_way(m, row["target"])
        if way:
            tail += f"  {way[0]:.1f}  {way[1]:.0f}/{way[2]:.0f}"
        print(f"{row['target']:.2f}  " + "  ".join(cells) + "  " + tail)
        small = m["batch"] if m else None
        if way and small in steps:
            # S(small)/S(B) observed, and as B_simple predicts it.
            for b in f["batches"]:
                if b != small and b in steps:
                    predicted = (1 + way[1] / small) / (1 + way[1] / b)
                    print(f"      S({small})/S({b}): observed "
                          f"{steps[small] / steps[b]:.2f}, predicted from "
                          f"B_simple {way[1]:.0f}: {predicted:.2f}")


if __name__ == "__main__":
    main()
