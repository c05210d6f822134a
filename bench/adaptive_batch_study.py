"""Growing the batch: adaptive and scheduled batches against fixed ones.

The large-batch study's network and data (ResNet-8 of width 4 on
Fashion-MNIST), the batch grown during training by
`keras-largebatch-train --adaptive_batch=...`:

- `noise_scale`: the batch follows B_simple (`keras_largebatch.AdaptiveBatch`),
  from `--start_batch` (micro-batches of `--micro_batch`) up to
  `--max_batch`;
- `schedule`: Smith et al.'s plan, the fixed `--schedule` steps.

Each (policy, optimizer) gets a sweep of `--rates` peak rates (log-spaced
by 2x around `--center_rates`, extended while the best is at an edge), the
best again with a second seed. The fixed batches are not run again: their
runs are read from the large-batch study's JSON files (`--fixed`). It writes
`<out>.json` (every run), `<out>.md` (the table: final accuracy, updates,
examples, updates to each `--targets` accuracy) and `<out>.png` (accuracy
against updates, every run, fixed and grown, on the same axes). Finished
runs are kept and skipped on a rerun; `--report_only` rewrites the outputs.

    KERAS_BACKEND=jax python bench/adaptive_batch_study.py --optimizers sgd
"""

import argparse
import datetime
import json
import math
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import large_batch_study as lbs  # noqa: E402
import seeds  # noqa: E402

HERE = lbs.HERE
FIXED = [os.path.join(lbs.RESULTS, "large_batch_study.json"),
         os.path.join(lbs.RESULTS, "noise_scale_sweeps.json")]
# Seeds measured beside the study's own runs, kept without their curves
# (each with its machine and date).
SEED_RECORDS = os.path.join(lbs.RESULTS, "adaptive_batch_seeds.json")
# The fixed batches' best rates of the large-batch study: the centre of
# each sweep here (the rate tuned at the starting batch).
CENTER = {"sgd": 0.2, "lars_mixed": 14.1, "lamb_mixed": 0.0226}


def run_key(r):
    return (f"{r['policy']}|{r['optimizer']}|{r['epochs']}|{r['rate']:.6g}|"
            f"{r['seed']}|{r['lr_rule']}{_multiple(r)}")


def _multiple(r):
    """`|c2` for a noise-scale run at 2 x B_simple; empty at 1."""
    c = r.get("c", 1.0)
    return "" if c == 1.0 else f"|c{c:g}"


def model_dir_of(spec, args):
    return os.path.join(args.work_dir, run_key(spec).replace("|", "_"))


def train_argv(spec, args):
    """The command's arguments of one grown-batch run."""
    fixed = dict(spec, batch=args.start_batch, phase=spec["policy"])
    argv = lbs.train_argv(fixed, _as_lbs_args(args))
    argv = [a for a in argv if not a.startswith(
        ("--model_dir=", "--gradient_accumulation_steps="))]
    argv += [f"--model_dir={model_dir_of(spec, args)}",
             "--gradient_accumulation_steps="
             f"{args.start_batch // args.micro_batch}",
             f"--adaptive_batch={spec['policy']}",
             f"--max_global_batch_size={args.max_batch}"]
    if spec["policy"] == "schedule":
        argv.append(f"--batch_schedule={args.schedule}")
    argv.append(f"--adaptive_learning_rate={spec['lr_rule']}")
    if spec.get("c", 1.0) != 1.0:
        argv.append(f"--noise_scale_multiple={spec['c']}")
    return argv


def _as_lbs_args(args):
    return argparse.Namespace(
        model="resnet_cifar", depth=8, width=4, dataset="fashion_mnist",
        weight_decay=5e-4, label_smoothing=0.1, bn_momentum=0.9,
        replica_batch=args.micro_batch, steps_per_epoch=args.steps_per_epoch,
        data_dir=args.data_dir, work_dir=args.work_dir)


def one_run(spec, args):
    """One grown-batch run, in a process of its own, and its record."""
    wall = lbs.run_command(train_argv(spec, args))
    return lbs.collect(spec, _as_lbs_args(args), wall,
                       model_dir_of(spec, args))


def curve(run):
    """(cumulative updates, val accuracy) at each epoch's end. A grown run's
    updates per epoch are num_train / its batch that epoch; a fixed run's
    num_train / batch."""
    n = run["num_train"]
    batches = run.get("batch_per_epoch") or [run["batch"]] * len(
        run["val_accuracy_per_epoch"])
    updates, total = [], 0.0
    for b in batches:
        total += n / b
        updates.append(total)
    return updates, run["val_accuracy_per_epoch"]


def updates_to(run, target):
    """Updates to the first epoch whose accuracy reaches `target`,
    interpolated linearly within that epoch (`seeds.updates_to`); None if
    never."""
    return seeds.updates_to(list(zip(*curve(run))), target)


def fixed_runs(args):
    """The fixed-batch runs of the large-batch study at `args.epochs`: the
    best of each (optimizer, batch)."""
    pool = []
    for path in FIXED:
        if os.path.exists(path):
            with open(path) as f:
                pool += json.load(f)["runs"]
    out = {}
    for r in pool:
        if r["epochs"] != args.epochs or r["seed"] != 0:
            continue
        key = (r["optimizer"], r["batch"])
        if key not in out or r["val_accuracy"] > out[key]["val_accuracy"]:
            out[key] = r
    return out


def best(runs, policy, optimizer, epochs):
    pool = [r for r in runs if r["policy"] == policy and r["seed"] == 0
            and r["optimizer"] == optimizer and r["epochs"] == epochs]
    return max(pool, key=lambda r: r["val_accuracy"]) if pool else None


def plan(args, runs):
    """Sweeps first (noise-scale policy before the schedule), each extended
    while its best rate is at an edge; then the best of each with seed 1."""
    for policy in args.policies:
        for optimizer in args.optimizers:
            center = args.center or CENTER[optimizer]
            low = -(args.rates // 2)
            rates = args.rate_list or [
                center * 2.0 ** k for k in range(low, low + args.rates)]
            for rate in sorted(rates, key=lambda r: abs(math.log(r / center))):
                yield spec_of(args, policy, optimizer, rate, 0)
            for _ in range(args.extend):
                top = best(runs, policy, optimizer, args.epochs)
                swept = sorted(r["rate"] for r in runs if r["policy"] == policy
                               and r["optimizer"] == optimizer
                               and r["epochs"] == args.epochs
                               and r["seed"] == 0)
                if top is None or len(swept) < args.rates:
                    break
                if top["rate"] == swept[0]:
                    yield spec_of(args, policy, optimizer, swept[0] / 2, 0)
                elif top["rate"] == swept[-1]:
                    yield spec_of(args, policy, optimizer, swept[-1] * 2, 0)
                else:
                    break
    for policy in args.policies:
        for optimizer in args.optimizers:
            top = best(runs, policy, optimizer, args.epochs)
            if top is not None:
                yield spec_of(args, policy, optimizer, top["rate"], 1)


def spec_of(args, policy, optimizer, rate, seed):
    _, warmup = lbs.recipe_default(optimizer, args.start_batch, args.epochs)
    return dict(policy=policy, optimizer=optimizer, epochs=args.epochs,
                rate=rate, seed=seed, warmup_epochs=warmup,
                start_batch=args.start_batch, max_batch=args.max_batch,
                micro_batch=args.micro_batch,
                lr_rule=args.lr_rule or _auto_rule(optimizer),
                c=args.c if policy == "noise_scale" else 1.0)


def _auto_rule(optimizer):
    """The rule `--adaptive_learning_rate=auto` takes for `optimizer`."""
    return "sqrt" if optimizer == "sgd" else "unchanged"


def report(record, args, path):
    fixed = fixed_runs(args)
    targets = args.targets
    head = ("| run | optimizer | rate | seed | final val acc | updates | "
            "examples | " + " | ".join(f"updates to {t}" for t in targets)
            + " | batch by epoch |")
    lines = [
        f"# Growing the batch: ResNet-8 (width 4) on Fashion-MNIST, "
        f"{args.epochs} epochs",
        "",
        f"Machine: {record['machine']}. Command: `{record['command']}`. "
        f"Grown runs start at {args.start_batch} (micro-batches of "
        f"{args.micro_batch}), at most {args.max_batch}. Fixed batches: the "
        "large-batch study's best runs at this budget.", "",
        "Each row one run (one seed); the seeds of each configuration "
        "together: the table after.",
        "", head, "|" + "---|" * (head.count("|") - 1)]

    def row(name, r):
        updates, _ = curve(r)
        to = [updates_to(r, t) for t in targets]
        batches = r.get("batch_per_epoch") or [r["batch"]]
        return (f"| {name} | {r['optimizer']} | {r['rate']:.4g} | "
                f"{r['seed']} | {r['val_accuracy']:.4f} | {updates[-1]:.0f} | "
                f"{r['num_train'] * r['epochs']:,} | "
                + " | ".join("—" if u is None else f"{u:.0f}" for u in to)
                + f" | {_compact(batches)} |")

    for (optimizer, batch), r in sorted(fixed.items()):
        if optimizer in args.optimizers:
            lines.append(row(f"fixed {batch}", r))
    for r in sorted(record["runs"], key=lambda r: (
            r["policy"], r["optimizer"], r["lr_rule"], r["rate"], r["seed"])):
        lines.append(row(f"{r['policy']}, {r['lr_rule']}"
                         + _multiple(r).replace("|", ", "), r))
    lines += [""] + over_seeds(record, args)
    from keras_largebatch._shared import atomic_write

    atomic_write(path, "\n".join(lines) + "\n")
    return "\n".join(lines)


def seed_key(r):
    """A configuration of this study, fixed or grown: all but the seed."""
    if "policy" in r:
        return ("grown", r["optimizer"], r["epochs"], round(r["rate"], 9),
                r["policy"], r["lr_rule"], r.get("c", 1.0))
    return ("fixed", r["optimizer"], r["epochs"], round(r["rate"], 9),
            r["batch"], "", 1.0)


def _reached(r, target):
    """A run's updates to `target`: from its curve, or as recorded (runs
    kept without their curve, `SEED_RECORDS`)."""
    if "updates_to" in r:
        return r["updates_to"].get(f"{target:g}")
    return updates_to(r, target)


def over_seeds(record, args):
    """The table of every configuration over its seeds: this study's runs,
    every fixed run of the large-batch study at this budget, and the
    seeds kept in `SEED_RECORDS` (machine, date in each)."""
    pool = []
    for path in FIXED:
        if os.path.exists(path):
            with open(path) as f:
                pool += [r for r in json.load(f)["runs"]
                         if r["epochs"] == args.epochs
                         and r["optimizer"] in args.optimizers]
    pool += record["runs"]
    if os.path.exists(SEED_RECORDS):
        with open(SEED_RECORDS) as f:
            for r in json.load(f)["runs"]:
                if r["epochs"] == args.epochs and r["optimizer"] in \
                        args.optimizers:
                    pool.append(dict(r, policy=r["policy"]) if r["kind"]
                                == "grown" else r)
    found = seeds.aggregate(pool, seed_key, [], _reached)
    # Per target: a kept seed without that target's crossing is left out.
    for t in args.targets:
        known = [r for r in pool if "updates_to" not in r
                 or f"{t:g}" in r["updates_to"]]
        for key, s in seeds.aggregate(known, seed_key, [t], _reached).items():
            for field in ("median_to", "reached", "updates_to"):
                found[key][field][t] = s[field][t]
            found[key].setdefault("n_to", {})[t] = s["n"]
    head = ("| configuration | rate | seeds | final val acc | "
            + " | ".join(f"median updates to {t} (reached)"
                         for t in args.targets) + " |")
    lines = ["Over seeds (mean ± sample sd; median updates with a seed that "
             "never got there counted as infinite):", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for key, s in sorted(found.items(), key=lambda kv: str(kv[0])):
        kind, optimizer, _, rate, what, rule, c = key
        name = (f"fixed {what}, {optimizer}" if kind == "fixed" else
                f"{what}, {rule}" + ("" if c == 1.0 else f", c {c:g}")
                + f", {optimizer}")
        to = [("never" if s["median_to"][t] is None
               else f"{s['median_to'][t]:,.0f}") + f" ({s['reached'][t]}/"
              f"{s['n_to'][t]})" if t in s.get("n_to", {}) else "—"
              for t in args.targets]
        lines.append(f"| {name} | {rate:g} | "
                     f"{', '.join(map(str, s['seeds']))} | "
                     f"{seeds.describe(s)} | " + " | ".join(to) + " |")
    return lines


def _compact(batches):
    """`128 x3, 256 x2, ...`: the batch of each epoch, run-length coded."""
    out = []
    for b in batches:
        if out and out[-1][0] == b:
            out[-1][1] += 1
        else:
            out.append([b, 1])
    return ", ".join(f"{b}" + (f"×{n}" if n > 1 else "") for b, n in out)


def plot(record, args, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fixed = fixed_runs(args)
    optimizers = args.optimizers
    fig, axes = plt.subplots(1, len(optimizers),
                             figsize=(5.5 * len(optimizers), 4), squeeze=False)
    styles = {"noise_scale": "-", "schedule": "-."}
    for ax, optimizer in zip(axes[0], optimizers):
        mine = [(b, r) for (o, b), r in sorted(fixed.items()) if o == optimizer]
        for j, (batch, r) in enumerate(mine):
            u, a = curve(r)
            ax.plot(u, a, ":o", ms=3, color=str(0.6 * j / max(1, len(mine) - 1)),
                    label=f"fixed {batch}, lr {r['rate']:.3g}")
        grown = [r for r in record["runs"] if r["optimizer"] == optimizer]
        for i, r in enumerate(grown):
            u, a = curve(r)
            ax.plot(u, a, styles.get(r["policy"], "-"), marker=".",
                    color=plt.cm.tab20(i % 20),
                    label=f"{r['policy']}, lr {r['rate']:.3g}, seed {r['seed']}"
                          + f", {r['lr_rule']}"
                          + _multiple(r).replace("|", ", "))
        ax.set_xscale("log")
        ax.set_xlabel("optimizer updates")
        ax.set_ylabel("validation accuracy")
        ax.set_ylim(0.75, 0.93)
        ax.grid(alpha=0.3)
        ax.set_title(f"{optimizer}, {args.epochs} epochs", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizers", nargs="+", default=["sgd"],
                   choices=["sgd", "lars_mixed", "lamb_mixed"])
    p.add_argument("--policies", nargs="+", default=["noise_scale", "schedule"],
                   choices=["noise_scale", "schedule"])
    p.add_argument("--epochs", type=int, default=24)
    p.add_argument("--start_batch", type=int, default=128)
    p.add_argument("--micro_batch", type=int, default=64)
    p.add_argument("--max_batch", type=int, default=4096)
    p.add_argument("--schedule", default="3:256,6:512,9:1024,12:2048,15:4096",
                   help="the schedule policy's EPOCH:BATCH steps")
    p.add_argument("--lr_rule", default="",
                   choices=["", "unchanged", "adascale", "linear", "sqrt"],
                   help="--adaptive_learning_rate of the runs (default: "
                        "what the command's auto takes, recorded as such)")
    p.add_argument("--c", type=float, default=1.0,
                   help="noise-scale runs: the batch follows c x B_simple "
                        "(--noise_scale_multiple)")
    p.add_argument("--rates", type=int, default=4)
    p.add_argument("--rate_list", type=float, nargs="+", default=[],
                   help="run these rates (default: --rates around the "
                        "centre), e.g. to split a sweep over two processes")
    p.add_argument("--merge", nargs="+", default=[],
                   help="other JSON files of this study whose runs join "
                        "the report (a sweep split over processes)")
    p.add_argument("--extend", type=int, default=2)
    p.add_argument("--center", type=float, default=0.0,
                   help="the sweep's centre rate (default: the fixed "
                        "starting batch's best)")
    p.add_argument("--targets", type=float, nargs="+", default=[0.88, 0.90])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--steps_per_epoch", type=int, default=0)
    p.add_argument("--data_dir", default="")
    p.add_argument("--work_dir", default=os.path.join("runs", "adaptive"))
    p.add_argument("--out", default=os.path.join(
        lbs.RESULTS, "adaptive_batch_study"))
    p.add_argument("--report_only", action="store_true")
    return p


def main():
    args = make_parser().parse_args()
    from keras_largebatch._shared import atomic_write

    json_path = args.out + ".json"
    record = {"runs": []}
    if os.path.exists(json_path):
        with open(json_path) as f:
            record = json.load(f)
    if not (args.report_only and record.get("command")):
        record.update(
            command="python bench/adaptive_batch_study.py "
                    + " ".join(sys.argv[1:]),
            machine=f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU")
    record.setdefault("started", datetime.date.today().isoformat())
    done = {run_key(r) for r in record["runs"]}
    if not args.report_only:
        for spec in plan(args, record["runs"]):
            if run_key(spec) in done or spec["seed"] >= args.seeds:
                continue
            r = one_run(spec, args)
            record["runs"].append(r)
            done.add(run_key(r))
            atomic_write(json_path, json.dumps(record, indent=1))
            print(f"{r['policy']:11s} {r['optimizer']:10s} lr {r['rate']:8.4g} "
                  f"seed {r['seed']} -> val {r['val_accuracy']:.4f}, "
                  f"batches {_compact(r['batch_per_epoch'])} "
                  f"({r['wall_seconds']:.0f} s)", flush=True)
    atomic_write(json_path, json.dumps(record, indent=1))
    for path in args.merge:
        with open(path) as f:
            record["runs"] += [r for r in json.load(f)["runs"]
                               if run_key(r) not in done]
    print(report(record, args, args.out + ".md"))
    plot(record, args, args.out + ".png")


if __name__ == "__main__":
    main()
