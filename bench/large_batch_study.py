"""Large-batch study: does LARS hold accuracy where SGD loses it?

One model and data set (by default ResNet-8 of width 4 on Fashion-MNIST),
a small batch B and a large batch `factor` x B, each optimizer with its
recipe (SGD: Goyal et al.'s linear rule and warmup; LARSMixed: MLPerf's
table). Three phases, every run one `keras-largebatch-train` process:

1. short budget (`--short_epochs`): for each (optimizer, batch) a sweep of
   `--rates` peak rates, log-spaced around the recipe's default by factors
   of `--rate_step`, extended by up to `--extend` rates while the best one
   is at an edge; the recipe's warmup is kept;
2. the best rate of each (optimizer, batch) again with a second seed;
3. long budget (`--long_epochs`): the best short-budget rate of each
   (optimizer, batch), once. Each budget is kept apart (its epochs are in
   the run's key), so a longer one can be added later and claim (b) is
   reported per budget.

It writes `<out>.json` (every run: flags, per-epoch curves, final and best
validation accuracy, wall time), `<out>.md` (the tables and the claims as
measured) and `<out>.png` (accuracy against batch per optimizer with every
sweep point, and the long-budget curves). Finished runs are kept in the
JSON and skipped when the study is run again, so it can be stopped and
resumed; `--report_only` rewrites the outputs from the JSON.

    python bench/large_batch_study.py                   # hours on a 2-core CPU
    python bench/large_batch_study.py --short_epochs 1 --long_epochs 1 \\
        --rates 2 --steps_per_epoch 2 --out /tmp/smoke  # a smoke run
"""

import argparse
import csv
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seeds  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def recipe_default(optimizer, batch, epochs):
    """(peak rate, warmup epochs) that the command's recipe would use."""
    from keras_largebatch.train import recipe

    peak = recipe.peak_learning_rate(optimizer, 0.0, batch)
    return peak, recipe.warmup_epochs_for(optimizer, "auto", batch, epochs)


def sweep_rates(default, count, step):
    """`count` rates log-spaced by `step` around `default` (it included)."""
    low = -(count // 2)
    return [default * step ** k for k in range(low, low + count)]


def run_key(r):
    return (f"{r['phase']}|{r['optimizer']}|{r['batch']}|{r['epochs']}|"
            f"{r['rate']:.6g}|{r['seed']}")


def model_dir_of(spec, args):
    return os.path.join(args.work_dir, run_key(spec).replace("|", "_"))


def train_argv(spec, args):
    """The `keras-largebatch-train` arguments of one run (no program name)."""
    argv = [
        f"--model_dir={model_dir_of(spec, args)}", f"--model={args.model}",
        f"--resnet_depth={args.depth}", f"--resnet_width={args.width}",
        f"--dataset={args.dataset}", f"--global_batch_size={spec['batch']}",
        f"--optimizer={spec['optimizer']}", f"--epochs={spec['epochs']}",
        f"--warmup_epochs={spec['warmup_epochs']}", "--lr_scaling=none",
        f"--base_learning_rate={spec['rate']}", f"--seed={spec['seed']}",
        f"--weight_decay={args.weight_decay}",
        f"--label_smoothing={args.label_smoothing}",
        f"--bn_momentum={args.bn_momentum}", "--augment=none",
        "--gradient_accumulation_steps="
        f"{max(1, spec['batch'] // args.replica_batch)}",
        "--precision=float32", "--verbose=0",
    ]
    if args.steps_per_epoch:
        argv.append(f"--steps_per_epoch={args.steps_per_epoch}")
    if args.data_dir:
        argv.append(f"--data_dir={args.data_dir}")
    return argv


def train_command(argv):
    """The process command line of `keras-largebatch-train argv`, with this
    interpreter."""
    return [sys.executable, "-c",
            "from keras_largebatch.train.main import run; run()", *argv]


def run_command(argv):
    """`keras-largebatch-train argv` in a process of its own; its wall time
    in seconds (a failed run ends the study with its stderr)."""
    cmd = train_command(argv)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def one_run(spec, args):
    """One run, in a process of its own."""
    return collect(spec, args, run_command(train_argv(spec, args)))


def collect(spec, args, wall_seconds, model_dir=None):
    """The record of a finished run, from its summary and history (in
    `model_dir`, default `model_dir_of(spec, args)`); a grown-batch run's
    also holds the batch and B_simple of each epoch and the updates."""
    model_dir = model_dir or model_dir_of(spec, args)
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(model_dir, "history.csv")) as f:
        rows = list(csv.DictReader(f))
    grown = {}
    if rows and "global_batch_size" in rows[0]:
        grown = dict(
            batch_per_epoch=[int(float(r["global_batch_size"])) for r in rows],
            noise_scale_per_epoch=[
                float(r.get("gradient_noise_scale") or "nan") for r in rows],
            updates=summary.get("updates"))
    return dict(
        spec,
        **grown,
        val_accuracy=summary["val_accuracy"],
        val_accuracy_per_epoch=[float(r["val_accuracy"]) for r in rows],
        train_loss_per_epoch=[float(r["loss"]) for r in rows],
        train_accuracy_per_epoch=[float(r["accuracy"]) for r in rows],
        val_loss_per_epoch=[float(r["val_loss"]) for r in rows],
        best_val_accuracy=max(float(r["val_accuracy"]) for r in rows),
        images_per_sec=summary.get("images_per_sec"),
        num_train=summary["num_train"],
        backend=summary["backend"],
        wall_seconds=wall_seconds,
        # Every epoch's training time, from the history: more than the wall
        # time when the run resumed from its backup (the wall time counts the
        # last process only).
        train_seconds=None if args.steps_per_epoch else sum(
            summary["num_train"] / float(r["images_per_sec"]) for r in rows),
        loadavg_after=os.getloadavg()[0],
        finished=datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
    )


def precise_bn_eval(run, args, count):
    """The run's final model evaluated with batch-norm statistics averaged
    over `count` training batches (`--mode=eval --precise_bn_batches`)."""
    model_dir = model_dir_of(run, args)
    # Only the run's own model: a folder reused by another run (or gone)
    # says so by its summary.
    try:
        with open(os.path.join(model_dir, "summary.json")) as f:
            summary = json.load(f)
    except OSError:
        summary = {}
    if summary.get("val_accuracy") != run["val_accuracy"]:
        print(f"precise BN {run_key(run)}: skipped, {model_dir} does not "
              "hold this run's model", flush=True)
        return None
    cmd = [sys.executable, "-c",
           "from keras_largebatch.train.main import run; run()",
           f"--model_dir={model_dir}", "--mode=eval",
           f"--precise_bn_batches={count}", "--verbose=0"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"eval failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    with open(os.path.join(model_dir, "eval.json")) as f:
        result = json.load(f)
    return dict(precise_bn_batches=count,
                val_accuracy=result["val_accuracy"],
                val_loss=result["val_loss"])


def best(runs, phase, optimizer, batch):
    """The run of highest final validation accuracy (seed 0)."""
    pool = [r for r in runs if r["phase"] == phase and r["seed"] == 0
            and r["optimizer"] == optimizer and r["batch"] == batch]
    return max(pool, key=lambda r: r["val_accuracy"]) if pool else None


def plan(args, runs):
    """Yields run specs, most informative first, so a partial study says
    something: both optimizers' sweeps at the large batch (claim a), SGD's at
    the small batch, the long runs of claim (b), the second seeds, the rest.
    Runs that need a best rate are yielded once the sweep behind it exists.
    """
    small, large = args.small_batch, args.small_batch * args.factors[0]
    first, others = "sgd", [o for o in args.optimizers if o != "sgd"]

    def sweep(optimizer, batch):
        default, warmup = recipe_default(optimizer, batch, args.short_epochs)
        rates = sweep_rates(default, args.rates, args.rate_step)
        # The default first, then lower rates before higher ones (a rate
        # that diverges is the likelier failure at a large batch).
        rates.sort(key=lambda r: abs(math.log(r / default)) + 1e-3 * (r > default))
        return [dict(phase="short", optimizer=optimizer, batch=batch,
                     epochs=args.short_epochs, rate=rate, seed=0,
                     default_rate=default, warmup_epochs=warmup)
                for rate in rates]

    def follow(phase, optimizer, batch):
        top = best(runs, "short", optimizer, batch)
        if top is None:
            return []
        epochs = args.long_epochs if phase == "long" else args.short_epochs
        _, warmup = recipe_default(optimizer, batch, epochs)
        # A long budget may want another rate: `--long_rate_factors` runs
        # multiples of the short budget's best there too.
        factors = args.long_rate_factors if phase == "long" else [1.0]
        return [dict(phase=phase, optimizer=optimizer, batch=batch,
                     epochs=epochs, rate=top["rate"] * factor,
                     seed=1 if phase == "seed" else 0,
                     default_rate=top["default_rate"], warmup_epochs=warmup)
                for factor in factors]

    def extend(optimizer, batch):
        # A best rate at the edge of the sweep is not bracketed: go one
        # step further that way, up to `--extend` times.
        for _ in range(args.extend):
            pool = [r for r in runs if r["phase"] == "short" and r["seed"] == 0
                    and r["optimizer"] == optimizer and r["batch"] == batch]
            if not pool:
                return
            rates = sorted(r["rate"] for r in pool)
            top = best(runs, "short", optimizer, batch)
            if top["rate"] == rates[0]:
                rate = rates[0] / args.rate_step
            elif top["rate"] == rates[-1]:
                rate = rates[-1] * args.rate_step
            else:
                return
            _, warmup = recipe_default(optimizer, batch, args.short_epochs)
            yield dict(phase="short", optimizer=optimizer, batch=batch,
                       epochs=args.short_epochs, rate=rate, seed=0,
                       default_rate=top["default_rate"], warmup_epochs=warmup)

    for group in zip(*(sweep(o, large) for o in args.optimizers)):
        yield from group
    for optimizer in args.optimizers:
        yield from extend(optimizer, large)
    yield from sweep(first, small)
    yield from extend(first, small)
    for optimizer, batch in [(first, small)] + [(o, large) for o in others] + [
            (first, large)]:
        yield from follow("long", optimizer, batch)
    for optimizer, batch in [(o, large) for o in args.optimizers] + [
            (first, small)]:
        yield from follow("seed", optimizer, batch)
    for optimizer in others:
        yield from sweep(optimizer, small)
        yield from extend(optimizer, small)
        yield from follow("seed", optimizer, small)
        yield from follow("long", optimizer, small)
    for factor in args.factors[1:]:
        for optimizer in args.optimizers:
            yield from sweep(optimizer, small * factor)
            yield from extend(optimizer, small * factor)
            yield from follow("seed", optimizer, small * factor)
            yield from follow("long", optimizer, small * factor)


def claims(record):
    """The issue's two claims, as measured (None where a run is missing)."""
    runs, args = record["runs"], record["args"]
    small = args["small_batch"]
    large = small * args["factors"][0]
    acc_of = lambda run: (run or {}).get("val_accuracy")  # noqa: E731
    acc = lambda phase, opt, b: acc_of(best(runs, phase, opt, b))  # noqa: E731
    out = {}
    sgd_l, lars_l = acc("short", "sgd", large), acc("short", "lars_mixed", large)
    swept = all(
        sum(r["phase"] == "short" and r["seed"] == 0 and r["batch"] == large
            and r["optimizer"] == o for r in runs) >= args["rates"]
        for o in ("sgd", "lars_mixed"))
    if sgd_l is not None and lars_l is not None:
        gap = lars_l - sgd_l
        out["a"] = dict(
            complete=swept,
            text=f"at {large} and {args['short_epochs']} epochs, LARSMixed's "
                 f"best is >= 2 points above SGD's best",
            lars_mixed=lars_l, sgd=sgd_l, difference_points=100 * gap,
            holds=gap >= 0.02)

    def long_acc(epochs, optimizer, batch):
        return acc_of(best_long(runs, epochs, optimizer, batch))

    # Claim (b) at every long budget that has its three runs.
    for epochs in long_budgets(runs):
        sgd_s = long_acc(epochs, "sgd", small)
        sgd_l = long_acc(epochs, "sgd", large)
        lars_l = long_acc(epochs, "lars_mixed", large)
        text = (f"at {epochs} epochs, LARSMixed at {large} is within 1 "
                f"point of SGD at {small}, and SGD at {large} is >= 2 points "
                f"below it")
        if None not in (sgd_s, sgd_l, lars_l):
            out[f"b ({epochs} epochs)"] = dict(
                text=text,
                sgd_small=sgd_s, lars_mixed_large=lars_l, sgd_large=sgd_l,
                lars_gap_points=100 * (sgd_s - lars_l),
                sgd_gap_points=100 * (sgd_s - sgd_l),
                holds=(sgd_s - lars_l) <= 0.01 and (sgd_s - sgd_l) >= 0.02)
            continue
        missing = [name for name, v in ((f"SGD at {small}", sgd_s),
                                        (f"SGD at {large}", sgd_l),
                                        (f"LARSMixed at {large}", lars_l))
                   if v is None]
        entry = out[f"b ({epochs} epochs)"] = dict(
            text=text, holds=None, missing=missing)
        # Without SGD at the small batch at this budget, its longest shorter
        # budget is the reference: the small batch's accuracy grows with the
        # epochs, so the gaps to it are lower bounds.
        shorter = [e for e in long_budgets(runs)
                   if e < epochs and long_acc(e, "sgd", small) is not None]
        if missing == [f"SGD at {small}"] and shorter:
            ref = max(shorter)
            sgd_s = long_acc(ref, "sgd", small)
            entry.update(
                reference_epochs=ref, sgd_small_at_reference=sgd_s,
                lars_mixed_large=lars_l, sgd_large=sgd_l,
                lars_gap_points_lower_bound=100 * (sgd_s - lars_l),
                sgd_gap_points_lower_bound=100 * (sgd_s - sgd_l))
    return out


def long_budgets(runs):
    return sorted({r["epochs"] for r in runs if r["phase"] == "long"})


def best_long(runs, epochs, optimizer, batch):
    """The best run of (optimizer, batch) at the long budget of `epochs`."""
    at = [r for r in runs if r["phase"] == "long" and r["epochs"] == epochs]
    return best(at, "long", optimizer, batch)


def run_seconds(r):
    """A run's time: its wall time, or, for a run resumed from its backup,
    the training time of all its epochs (the wall time counts the last
    process only)."""
    return max(r["wall_seconds"], r.get("train_seconds") or 0)


def report(record, path):
    runs, args = record["runs"], record["args"]
    lines = [
        f"# Large-batch study: {args['model']} (depth {args['depth']}, width "
        f"{args['width']}) on {args['dataset']}",
        "",
        f"Machine: {record['machine']}. Backend: "
        f"{runs[0]['backend'] if runs else '?'}. Command: `{record['command']}`."
        f" Started {record['started']}; {len(runs)} runs, "
        f"{sum(run_seconds(r) for r in runs) / 3600:.2f} h of runs.",
        f"Batches above {args['replica_batch']} accumulate gradients over "
        f"batches of {args['replica_batch']} (per-replica batch norm). "
        f"Label smoothing {args['label_smoothing']}, weight decay "
        f"{args['weight_decay']} (kernels only), BN momentum "
        f"{args['bn_momentum']}, no augmentation, float32, warmup + poly(2).",
        "",
        "| phase | optimizer | batch | epochs | peak rate (recipe) | warmup "
        "epochs | seed | final val acc | best epoch val acc | final train "
        "loss | wall s | val acc, precise BN |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"short": 0, "seed": 1, "long": 2}
    for r in sorted(runs, key=lambda r: (order[r["phase"]], r["optimizer"],
                                          r["batch"], r["rate"], r["seed"])):
        lines.append(
            f"| {r['phase']} | {r['optimizer']} | {r['batch']} | "
            f"{r['epochs']} | {r['rate']:.4g} ({r['default_rate']:.4g}) | "
            f"{r['warmup_epochs']:.2f} | {r['seed']} | "
            f"{r['val_accuracy']:.4f} | {r['best_val_accuracy']:.4f} | "
            f"{r['train_loss_per_epoch'][-1]:.4f} | {run_seconds(r):.0f}"
            f"{' (resumed)' if run_seconds(r) > r['wall_seconds'] else ''} | "
            + (f"{r['precise_bn']['val_accuracy']:.4f} |" if r.get("precise_bn")
               else "|"))
    lines += ["", "## Over seeds", "",
              "Each configuration (phase aside) over its seeds: final "
              "accuracy mean ± sample sd, or one seed, which decides "
              "nothing; the claims below compare seed-0 runs.", "",
              "| optimizer | batch | epochs | peak rate | seeds | final val "
              "acc |", "|---|---|---|---|---|---|"]
    found = seeds.aggregate(
        runs, lambda r: (r["optimizer"], r["batch"], r["epochs"],
                         round(r["rate"], 9)), [], lambda r, t: None)
    for (optimizer, batch, epochs, rate), s in sorted(found.items()):
        lines.append(f"| {optimizer} | {batch} | {epochs} | {rate:.4g} | "
                     f"{', '.join(map(str, s['seeds']))} | "
                     f"{seeds.describe(s)} |")
    lines += ["", "## Claims, as measured (seed 0; one seed each)", ""]
    for name, c in record["claims"].items():
        verdict = "holds" if c["holds"] else "does not hold"
        if c["holds"] is None:
            verdict = f"not judged (no run of {', '.join(c['missing'])})"
            if "reference_epochs" in c:
                verdict += (f"; against SGD at {record['args']['small_batch']}"
                            f" at {c['reference_epochs']} epochs instead, the"
                            f" gaps are lower bounds")
        elif not c.get("complete", True):
            verdict = f"so far {verdict} (sweep not finished)"
        values = ", ".join(f"{k} {v:.4f}" for k, v in c.items()
                           if isinstance(v, float))
        lines.append(f"- ({name}) {c['text']}: **{verdict}**"
                     + (f" — {values}" if values else ""))
    from keras_largebatch._shared import atomic_write

    atomic_write(path, "\n".join(lines) + "\n")
    return "\n".join(lines)


def plot(record, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    runs = record["runs"]
    colors = {"sgd": "tab:blue", "lars_mixed": "tab:red",
              "lamb_mixed": "tab:green"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for opt in record["args"]["optimizers"]:
        c = colors.get(opt, "k")
        pts = [r for r in runs if r["optimizer"] == opt and r["phase"] != "long"]
        ax1.scatter([r["batch"] for r in pts], [r["val_accuracy"] for r in pts],
                    s=14, color=c, alpha=0.45)
        batches = sorted({r["batch"] for r in pts})
        tops = [best(runs, "short", opt, b) for b in batches]
        ax1.plot(batches, [t["val_accuracy"] for t in tops], "-o", color=c,
                 label=f"{opt}, best of sweep ({record['args']['short_epochs']} ep)")
        # The long runs that exist (a batch may not have one yet), per budget.
        budgets = long_budgets(runs)
        for i, (epochs, marker) in enumerate(zip(budgets, "s^Dv")):
            longs = [t for t in (best_long(runs, epochs, opt, b)
                                 for b in batches) if t]
            if not longs:
                continue
            ax1.plot([t["batch"] for t in longs],
                     [t["val_accuracy"] for t in longs], "--" + marker,
                     color=c, label=f"{opt}, {epochs} ep")
            for t in longs:
                ax2.plot(range(1, t["epochs"] + 1), t["val_accuracy_per_epoch"],
                         "-" if t["batch"] == batches[0] else "--", color=c,
                         alpha=0.35 + 0.65 * (i + 1) / len(budgets),
                         label=f"{opt}, batch {t['batch']}, {epochs} ep, "
                               f"lr {t['rate']:.3g}")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("global batch")
    ax1.set_ylabel("final validation accuracy")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    ax1.set_title("every sweep point (dots); best rate (lines)", fontsize=9)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("validation accuracy")
    ax2.grid(alpha=0.3)
    if ax2.lines:
        ax2.legend(fontsize=7)
        # The end of the runs, where the gaps are, rather than the warmup.
        final = [ln.get_ydata()[-1] for ln in ax2.lines]
        ax2.set_ylim(min(final) - 0.08, max(final) + 0.02)
    ax2.set_title("long budgets, best rates (later budgets darker)",
                  fontsize=9)
    a = record["args"]
    fig.suptitle(f"ResNet-{a['depth']} (width {a['width']}) on {a['dataset']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet_cifar")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--small_batch", type=int, default=128)
    parser.add_argument("--factors", type=int, nargs="+", default=[32])
    parser.add_argument("--optimizers", nargs="+",
                        default=["sgd", "lars_mixed"])
    parser.add_argument("--short_epochs", type=int, default=8)
    parser.add_argument("--long_epochs", type=int, default=24)
    parser.add_argument("--rates", type=int, default=4)
    parser.add_argument("--rate_step", type=float, default=2.0)
    parser.add_argument(
        "--extend", type=int, default=2,
        help="extra rates beyond a sweep whose best rate is at its edge")
    parser.add_argument("--weight_decay", type=float, default=5e-4)
    parser.add_argument("--label_smoothing", type=float, default=0.1)
    parser.add_argument("--bn_momentum", type=float, default=0.9)
    parser.add_argument(
        "--replica_batch", type=int, default=256,
        help="larger batches accumulate gradients over batches of this size "
             "(batch norm per batch of it, as per replica on a cluster)")
    parser.add_argument("--steps_per_epoch", type=int, default=0)
    parser.add_argument("--phases", nargs="+", default=["short", "seed", "long"])
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[],
        help="run only these global batches (default: all), e.g. to split "
             "the study over two processes with their own --out")
    parser.add_argument(
        "--long_rate_factors", type=float, nargs="+", default=[1.0],
        help="at the long budget, run these multiples of the short budget's "
             "best rate (default: the best rate only); claim (b) takes the "
             "best of them")
    parser.add_argument(
        "--data_dir", default="",
        help="the data set's folder (default: where the command looks)")
    parser.add_argument("--work_dir", default=os.path.join("runs", "study"))
    parser.add_argument("--out", default=os.path.join(
        RESULTS, "large_batch_study"))
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument(
        "--precise_bn_eval", type=int, default=0,
        help="N > 0: evaluate the final model of each long and seed run and "
             "of the best short run of each (optimizer, batch) again with "
             "batch-norm statistics averaged over N training batches "
             "(precise BN)")
    return parser


def main():
    parser = make_parser()
    args = parser.parse_args()
    for factor in args.long_rate_factors:
        if not factor > 0:
            parser.error(f"--long_rate_factors: each factor must be > 0, got "
                         f"{factor}")

    from keras_largebatch._shared import atomic_write

    json_path = args.out + ".json"
    record = {"runs": []}
    if os.path.exists(json_path):
        with open(json_path) as f:
            record = json.load(f)
    if not (args.report_only and record.get("args")):
        record.update(
            # The output path as the repository sees it, not this machine.
            args=dict(vars(args), out=os.path.relpath(
                os.path.abspath(args.out), os.path.dirname(HERE))),
            command="python bench/large_batch_study.py "
                    + " ".join(sys.argv[1:]),
            machine=f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
        )
    record.setdefault("started", datetime.date.today().isoformat())
    done = {run_key(r) for r in record["runs"]}

    def save():
        record["claims"] = claims(record)
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        atomic_write(json_path, json.dumps(record, indent=1))

    if not args.report_only:
        for spec in plan(args, record["runs"]):
            if (spec["phase"] not in args.phases or run_key(spec) in done
                    or spec["optimizer"] not in args.optimizers
                    or args.batches and spec["batch"] not in args.batches):
                continue
            r = one_run(spec, args)
            record["runs"].append(r)
            done.add(run_key(r))
            save()
            print(f"{r['phase']:5s} {r['optimizer']:10s} batch {r['batch']:6d} "
                  f"lr {r['rate']:8.4g} seed {r['seed']} -> val "
                  f"{r['val_accuracy']:.4f} ({r['wall_seconds']:.0f} s)",
                  flush=True)
    if args.precise_bn_eval and not args.report_only:
        tops = {id(best(record["runs"], "short", r["optimizer"], r["batch"]))
                for r in record["runs"]}
        for r in record["runs"]:
            if (r["phase"] != "short" or id(r) in tops) and (
                    (r.get("precise_bn") or {}).get("precise_bn_batches")
                    != args.precise_bn_eval):
                result = precise_bn_eval(r, args, args.precise_bn_eval)
                if result is None:
                    continue
                r["precise_bn"] = result
                save()
                print(f"precise BN {run_key(r)}: {r['val_accuracy']:.4f} -> "
                      f"{result['val_accuracy']:.4f}", flush=True)
    save()
    print(report(record, args.out + ".md"))
    if record["runs"]:
        plot(record, args.out + ".png")


if __name__ == "__main__":
    main()
