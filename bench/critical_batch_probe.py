"""The critical batch measured directly, beside B_simple: branched probes
from the small batch's checkpoints (Merrill et al. 2025, arXiv:2505.23971;
McCandlish et al. 2018, arXiv:1812.06162).

The trajectory: `bench/batch_scaling_study.py`'s workload (ResNet-8 of
width 4, Fashion-MNIST, SGD with momentum 0.9) at its small batch, 128 at
0.2 with the 24-epoch schedule, seed 0, its epoch checkpoints kept
(`--keep_checkpoints`) and stopped after the last one the probes read
(`EPOCHS_AT`): the first epochs of the full run.

A probe: from the checkpoint after epoch e, `keras-largebatch-train
--init_weights=...` for one epoch (the same 60,000 examples at every batch
B: 469 updates at 128, 30 at 2,048), at the rate the trajectory had there
(its `learning_rate` at epoch e) x B / 128 held constant (the linear rule,
the one the command's defaults follow for SGD), momentum restarted, batch
norm over micro-batches of at most 256 (gradients accumulated above, as in
the study), a data order of its own (`--seed`, never the trajectory's).
The small batch's probes (`SMALL_SEEDS`, two data orders) also stop
after `SMALL_STEPS` updates, each a probe of its own, which traces the
validation loss against examples from the checkpoint's (`start_spec`; the
trajectory's own, from batch norm's moving averages, until it has run);
every probe evaluates once at its end, batch norm's statistics recomputed
first (`PRECISE_BN`). A batch's efficiency is the examples the small
batch needed to reach the validation loss that batch ends at (the first
crossing, interpolated; each small seed's curve, then the mean) over the
examples it took: McCandlish's E_min / E with 128 as the
reference, 1 for perfect scaling, capped at 1 where it ends below the small
batch's curve; the start's validation loss moves only a batch that ends
above the small batch's first point.

What the report gives at each checkpoint (`analyse`):
- the efficiency of each batch, which means something only where the
  small batch's own loss falls over the epoch (`small_fall`);
- the critical batch (Merrill et al.'s criterion): the largest probed
  batch whose validation loss after the epoch stays within `TOLERANCE` of
  the small batch's (the mean of its seeds), every smaller one too.
  `TOLERANCE` is about twice the difference between the small batch's own
  two seeds (0.008-0.010 at epochs 1 and 3). At a constant rate the small
  batch's loss levels off within the epoch once training is past its
  first epochs (0.80 +- 0.01 after 15,000 of the 60,000 examples from
  epoch 3), where the efficiency above is ill-conditioned and the loss at
  the end is not;
- B_noise fitted to McCandlish's trade-off, in which the examples needed
  grow as 1 + B / B_noise, so the efficiency against B0 = 128 is
  (1 + B0 / B_noise) / (1 + B / B_noise) (least squares in log B_noise),
  over the batches whose loss fell (one that ends above the checkpoint's
  loss was unstable at its rate, which the trade-off does not model:
  `rose`), from two batches on;
- B_simple, what `AdaptiveBatch` reads (`--gradient_noise_scale`, logged
  by the probes that accumulate, 512 and up, over their epoch: the median
  of the smallest of them, 512, whose 117 updates stay stable where a
  larger batch's may not),
  and the batch the command's defaults would ask for from it (c x
  B_simple on the lattice start x 2**j, up to the cap: `C`, `START`,
  `CAP`, from `keras_largebatch.adaptive_batch.defaults`).

Finished probes are kept in `<out>.json` and skipped on a rerun; `<out>.md`
holds the tables, `<out>.png` efficiency against the batch.

    KERAS_BACKEND=jax python bench/critical_batch_probe.py
    python bench/critical_batch_probe.py --report_only
"""

import argparse
import csv
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_scaling_study as bss  # noqa: E402
import large_batch_study as lbs  # noqa: E402

from keras_largebatch.adaptive_batch import defaults  # noqa: E402
from keras_largebatch.adaptive_batch import policies  # noqa: E402

OUT = os.path.join(lbs.RESULTS, "critical_batch_probe")
EPOCHS_AT = (1, 3, 8)
BATCHES = (128, 256, 512, 1024, 2048)
SMALL_SEEDS = (1, 2)  # the small batch's probes, two data orders
# The small batch's points on its curve: probes of these many updates
# (None: the whole epoch), from the same checkpoint and data order; batch
# norm's statistics are recomputed before evaluating (`PRECISE_BN`), which
# Keras' evaluations within an epoch cannot do.
SMALL_STEPS = (59, 117, 234, None)
# Batch norm's statistics recomputed over this many training batches before
# each evaluation (`--precise_bn_batches`): with the moving averages the
# validation loss jumped by 0.3-0.5 between evaluations after epoch 1.
PRECISE_BN = 16
START_RATE = 1e-12
LARGE_SEEDS = (1, 2)  # the larger batches' probes
TOLERANCE = 0.02  # validation loss
# The command's defaults from the small batch: c, the first batch, the cap.
C = defaults.NOISE_SCALE_MULTIPLE
START = bss.SMALL_BATCH * defaults.START_MULTIPLE
CAP = bss.SMALL_BATCH * defaults.MAX_MULTIPLE


def base_spec():
    return bss.fixed_spec(bss.SMALL_BATCH, bss.SMALL_RATE, 0)


def base_dir(work_dir):
    return os.path.join(work_dir, "base_" + bss.run_key(base_spec())
                        .split("|", 1)[1].replace("|", "_"))


def _base_argv(work_dir, data_dir):
    argv = [a for a in lbs.train_argv(base_spec(), bss._args(work_dir,
                                                             data_dir))
            if not a.startswith("--model_dir=")]
    return argv + [f"--model_dir={base_dir(work_dir)}"]


def checkpoint(work_dir, epoch):
    return os.path.join(base_dir(work_dir), "checkpoints",
                        f"epoch_{epoch:03d}.weights.h5")


def run_base(work_dir, data_dir):
    """The trajectory up to epoch max(EPOCHS_AT), its checkpoints kept;
    nothing when they exist."""
    last = checkpoint(work_dir, max(EPOCHS_AT))
    if os.path.exists(last):
        return
    argv = _base_argv(work_dir, data_dir) + [
        f"--keep_checkpoints={bss.EPOCHS}"]
    proc = subprocess.Popen(lbs.train_command(argv))
    while proc.poll() is None and not os.path.exists(last):
        time.sleep(5)
    time.sleep(5)  # the checkpoint written in full
    if proc.poll() is None:
        proc.terminate()
        proc.wait()
    if not os.path.exists(last):
        raise SystemExit(f"the trajectory stopped before {last}")


def _history(model_dir):
    with open(os.path.join(model_dir, "history.csv"), newline="") as f:
        return list(csv.DictReader(f))


def at_checkpoint(work_dir, epoch):
    """The trajectory's validation loss and rate after `epoch` epochs."""
    row = _history(base_dir(work_dir))[epoch - 1]
    return float(row["val_loss"]), float(row["learning_rate"])


def probe_specs():
    """The probes, checkpoint by checkpoint: the small batch's points
    (`SMALL_STEPS` updates each, None: the whole epoch) with each of
    `SMALL_SEEDS`, then each larger batch's epoch with `LARGE_SEEDS`
    (the first seed of every batch before the second)."""
    for epoch in EPOCHS_AT:
        for seed in SMALL_SEEDS:
            for steps in SMALL_STEPS:
                yield dict(epoch_at=epoch, batch=bss.SMALL_BATCH, seed=seed,
                           steps=steps)
        for batch in BATCHES[1:]:
            yield dict(epoch_at=epoch, batch=batch, seed=LARGE_SEEDS[0],
                       steps=None)
    for epoch in EPOCHS_AT:
        yield start_spec(epoch)
    for seed in LARGE_SEEDS[1:]:
        for epoch in EPOCHS_AT:
            for batch in BATCHES[1:]:
                yield dict(epoch_at=epoch, batch=batch, seed=seed, steps=None)


def start_spec(epoch):
    """The checkpoint evaluated as the probes are: one update at a rate of
    `START_RATE` (which moves no weight measurably), then batch norm's
    statistics recomputed and the validation loss."""
    return dict(epoch_at=epoch, batch=bss.SMALL_BATCH, seed=SMALL_SEEDS[0],
                steps=1, start=True)


def probe_key(p):
    if p.get("start"):
        return f"{p['epoch_at']}|start"
    return (f"{p['epoch_at']}|{p['batch']}|{p['seed']}"
            + (f"|{p['steps']}" if p.get("steps") else ""))


def probe_dir(p, work_dir):
    return os.path.join(work_dir, "probe_" + probe_key(p).replace("|", "_"))


def probe_rate(p, work_dir):
    """Probe `p`'s constant rate: the trajectory's at its checkpoint x
    batch / `SMALL_BATCH` (`START_RATE` for a start probe)."""
    if p.get("start"):
        return START_RATE
    _, rate = at_checkpoint(work_dir, p["epoch_at"])
    return rate * p["batch"] / bss.SMALL_BATCH


def probe_argv(p, work_dir, data_dir=""):
    """The command's arguments of probe `p`."""
    rate = probe_rate(p, work_dir)
    k = max(1, p["batch"] // bss.MICRO_BATCH)
    replaced = ("--model_dir=", "--global_batch_size=", "--epochs=",
                "--warmup_epochs=", "--base_learning_rate=", "--seed=",
                "--gradient_accumulation_steps=", "--evals_per_epoch=",
                "--steps_per_epoch=")
    argv = [a for a in _base_argv(work_dir, data_dir)
            if not a.startswith(replaced)]
    argv += [f"--model_dir={probe_dir(p, work_dir)}",
             f"--init_weights={checkpoint(work_dir, p['epoch_at'])}",
             f"--global_batch_size={p['batch']}", "--epochs=1",
             "--warmup_epochs=0", f"--base_learning_rate={rate:.6g}",
             f"--end_learning_rate={rate:.6g}", f"--seed={p['seed']}",
             f"--gradient_accumulation_steps={k}", "--keep_checkpoints=0",
             f"--precise_bn_batches={PRECISE_BN}"]
    if p.get("steps"):
        argv.append(f"--steps_per_epoch={p['steps']}")
    if k >= 2:
        argv.append("--gradient_noise_scale")
    return argv


def run_probe(p, work_dir, data_dir):
    argv = probe_argv(p, work_dir, data_dir)
    wall = lbs.run_command(argv)
    start_loss, _ = at_checkpoint(work_dir, p["epoch_at"])
    row = _history(probe_dir(p, work_dir))[-1]
    noise = row.get("gradient_noise_scale") or "nan"
    with open(os.path.join(probe_dir(p, work_dir), "summary.json")) as f:
        examples = json.load(f)["num_train"]
    if p.get("steps"):
        examples = min(examples, p["steps"] * p["batch"])
    return dict(p, rate=probe_rate(p, work_dir),
                start_val_loss=start_loss, val_loss=float(row["val_loss"]),
                val_accuracy=float(row["val_accuracy"]),
                train_loss=float(row["loss"]), b_simple=float(noise),
                examples=examples, wall_seconds=round(wall, 1))


# -------------------------------------------------------------- analysis


def mccandlish_efficiency(batch, b_noise, b0):
    """Progress per example at `batch` over `b0`'s when the examples needed
    grow as 1 + B / B_noise."""
    return (1 + b0 / b_noise) / (1 + batch / b_noise)


def fit_b_noise(points, b0):
    """B_noise minimising the squared error of `mccandlish_efficiency`
    against `points` [(batch, efficiency), ...]: a log grid from b0 / 16
    to 10**6, then a golden-section search around its best."""
    def loss(log_b):
        b = math.exp(log_b)
        return sum((mccandlish_efficiency(x, b, b0) - e) ** 2
                   for x, e in points)

    lo, hi = math.log(b0 / 16), math.log(1e6)
    grid = [lo + (hi - lo) * i / 400 for i in range(401)]
    best = min(grid, key=loss)
    a, b = best - (hi - lo) / 400, best + (hi - lo) / 400
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - g * (b - a), a + g * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2)


def critical_batch(excess, tolerance):
    """The largest batch of {batch: loss above the small batch's} within
    `tolerance`, every smaller one too; None when even the smallest is
    not."""
    found = None
    for batch in sorted(excess):
        if excess[batch] > tolerance:
            break
        found = batch
    return found


def policy_batch(b_simple, c=C, start=START, cap=CAP):
    """The batch the defaults' policy asks for from `b_simple`
    (`policies.POLICIES[defaults.POLICY]`: the lattice point nearest c x
    B_simple in log scale, `start` x 2**j, `start` before it is measured),
    at most `cap`."""
    inputs = policies.Inputs(epoch=0, batch_size=start, initial_steps=1, c=c,
                             schedule=None, b_simple=b_simple)
    steps = policies.POLICIES[defaults.POLICY].accumulation_steps(inputs)
    return min(cap, start * steps)


def examples_to(curve, loss, start_loss):
    """Examples at which `curve` [(examples, val_loss), ...] first reaches
    `loss` or below, linearly interpolated from the point before it
    ((0, `start_loss`) before the first); None if never."""
    prev_x, prev_l = 0.0, start_loss
    for x, current in curve:
        if current <= loss:
            if prev_l <= loss:
                return prev_x
            return prev_x + (prev_l - loss) / (prev_l - current) * (x - prev_x)
        prev_x, prev_l = x, current
    return None


def small_curves(points):
    """The small batch's probes of one checkpoint as one per seed, the
    whole epoch's, with `curve` [(examples, val_loss), ...] from all its
    points (only seeds whose whole epoch ran)."""
    out = []
    for seed in sorted({p["seed"] for p in points}):
        mine = sorted((p for p in points if p["seed"] == seed),
                      key=lambda p: p["examples"])
        if mine[-1].get("steps"):
            continue
        out.append(dict(mine[-1], curve=[[p["examples"], p["val_loss"]]
                                         for p in mine]))
    return out


def efficiency(probe, small):
    """`probe`'s efficiency against each of the `small` probes' curves:
    the examples that one needed to reach the loss `probe` ends at over the
    examples `probe` took, at most 1."""
    out = []
    for s in small:
        x = examples_to(s["curve"], probe["val_loss"], s["start_val_loss"])
        out.append(1.0 if x is None else min(1.0, x / probe["examples"]))
    return out


def analyse(probes, b0=None, tolerance=None):
    """{epoch_at: summary} from the probes: each batch's efficiency (mean
    over its probes on each of the small batch's curves, and each), the
    small batch's own (each small probe against the other's curve), each
    batch's loss after the epoch above the small batch's and the critical
    batch at `tolerance`, the fitted B_noise, B_simple (the median of the
    smallest batch's probes that logged it; each batch's in
    `b_simple_each`) and the batch the defaults ask for from it."""
    b0 = b0 or bss.SMALL_BATCH
    tolerance = TOLERANCE if tolerance is None else tolerance
    out = {}
    for epoch in sorted({p["epoch_at"] for p in probes}):
        here = [p for p in probes if p["epoch_at"] == epoch]
        start = [p["val_loss"] for p in here if p.get("start")]
        if start:
            here = [dict(p, start_val_loss=start[0]) for p in here
                    if not p.get("start")]
        small = small_curves([p for p in here if p["batch"] == b0])
        here = [p for p in here if not p.get("steps")]
        if not small:
            continue
        each = {}
        for p in here:
            if p["batch"] != b0:
                each.setdefault(p["batch"], []).extend(efficiency(p, small))
        eff = {b: statistics.fmean(v) for b, v in sorted(each.items())}
        # A probe that ends above the checkpoint's loss was unstable at its
        # rate, not slowed by gradient noise: left out of the fit.
        rose = sorted(p["batch"] for p in here if p["batch"] != b0
                      and p["val_loss"] >= small[0]["start_val_loss"])
        fitted = [(b, e) for b, e in eff.items() if b not in rose]
        ends = {}
        for p in here:
            ends.setdefault(p["batch"], []).append(p["val_loss"])
        excess = {b: statistics.fmean(v) - statistics.fmean(ends[b0])
                  for b, v in sorted(ends.items())}
        own = [e for p in small
               for e in efficiency(p, [q for q in small if q is not p])]
        noise = {}
        for p in here:
            if math.isfinite(p.get("b_simple", math.nan)):
                noise.setdefault(p["batch"], []).append(p["b_simple"])
        b_simple = statistics.median(noise[min(noise)]) if noise else math.nan
        out[epoch] = dict(
            start_val_loss=small[0]["start_val_loss"],
            end_val_loss=ends, efficiency={b0: 1.0, **eff},
            efficiency_each=each, small_own=own,
            excess=excess, critical=critical_batch(excess, tolerance),
            small_fall=small[0]["start_val_loss"] - statistics.fmean(ends[b0]),
            rose=rose,
            b_noise=fit_b_noise(fitted, b0) if len(fitted) > 1 else None,
            b_simple=b_simple, b_simple_each=noise,
            policy_batch=policy_batch(b_simple))
    return out


# ---------------------------------------------------------------- report


def markdown(record):
    summary = analyse(record["probes"])
    head = " | ".join(f"{b:,}" for b in BATCHES)
    rule = "---|" * len(BATCHES)
    lines = [
        "# Critical batch: branched probes and B_simple", "",
        f"Machine: {record.get('machine', '?')}; "
        f"`{record.get('command', '')}`.", "",
        f"Each probe: one epoch from the small batch's checkpoint, the rate "
        f"x batch / {bss.SMALL_BATCH}, constant. {bss.SMALL_BATCH}: seeds "
        f"{', '.join(map(str, SMALL_SEEDS))}; every larger batch a probe "
        f"per seed of {', '.join(map(str, LARGE_SEEDS))} run so far (the "
        f"mean of their losses).", "",
        f"**Validation loss after the epoch**, above {bss.SMALL_BATCH}'s "
        f"(the mean of its seeds; each seed's own loss in the second "
        f"column). Critical: the largest batch within {TOLERANCE:g}, every "
        f"smaller one too.", "",
        f"| after epoch | val loss there | {bss.SMALL_BATCH} (each seed) | "
        + " | ".join(f"{b:,}" for b in BATCHES[1:]) + " | critical |",
        "|---|---|---|" + "---|" * (len(BATCHES) - 1) + "---|"]
    for epoch, s in summary.items():
        small = ", ".join(f"{v:.4f}" for v in s["end_val_loss"][BATCHES[0]])
        cells = [f"{s['excess'][b]:+.4f}" if b in s["excess"] else "—"
                 for b in BATCHES[1:]]
        lines.append(f"| {epoch} | {s['start_val_loss']:.4f} | {small} | "
                     + " | ".join(cells) + f" | {s['critical']:,} |")
    lines += [
        "", f"**Efficiency**: the examples {bss.SMALL_BATCH} needed to "
        f"reach the loss a batch ends at, over the examples that batch took "
        f"(1: perfect scaling, at most 1; the mean over "
        f"{bss.SMALL_BATCH}'s curves; it means something only where "
        f"{bss.SMALL_BATCH}'s own loss falls over the epoch: its fall is in "
        f"the second column); its own: each of its seeds on the "
        f"other's curve. rose: the loss ended above the checkpoint's "
        f"(unstable at that rate; left out of the fit of B_noise). B_simple: "
        f"the {2 * bss.MICRO_BATCH} probes' median; the defaults' batch: "
        f"{C:g} x B_simple on {START} x 2**j, up to {CAP:,}.", "",
        f"| after epoch | {bss.SMALL_BATCH}'s fall | "
        f"{bss.SMALL_BATCH} on its other seed | {head} | "
        "B_noise fitted | B_simple | the defaults' batch from it |",
        "|---|---|---|" + rule + "---|---|---|"]
    for epoch, s in summary.items():
        eff = [("rose" if b in s["rose"] else f"{s['efficiency'][b]:.2f}")
               if b in s["efficiency"] else "—" for b in BATCHES]
        own = ", ".join(f"{e:.2f}" for e in s["small_own"]) or "—"
        lines.append(
            f"| {epoch} | {s['small_fall']:.4f} | {own} | "
            + " | ".join(eff) + " | "
            + ("—" if s["b_noise"] is None else f"{s['b_noise']:,.0f}")
            + f" | {s['b_simple']:,.0f} | {s['policy_batch']:,} |")
    return "\n".join(lines) + "\n"


def plot(record, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = analyse(record["probes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for epoch, s in summary.items():
        xs = sorted(s["excess"])
        line, = left.plot(xs, [s["excess"][x] for x in xs], "o-",
                          label=f"after epoch {epoch}")
        colour = line.get_color()
        if math.isfinite(s["b_simple"]):
            for ax in (left, right):
                ax.axvline(C * s["b_simple"], color=colour, ls="--", lw=0.8)
        if s["small_fall"] <= TOLERANCE:
            continue  # the small batch's curve is flat: no efficiency
        xs = sorted(s["efficiency"])
        right.plot(xs, [s["efficiency"][x] for x in xs], "o-", color=colour,
                   label=f"after epoch {epoch}")
        if s["b_noise"]:
            right.plot(xs, [mccandlish_efficiency(x, s["b_noise"],
                                                  bss.SMALL_BATCH)
                            for x in xs], ":", color=colour)
    left.axhline(TOLERANCE, color="grey", lw=0.8)
    left.set_yscale("symlog", linthresh=0.01)
    left.set_ylabel(f"val loss above {bss.SMALL_BATCH}'s after one epoch")
    right.set_ylabel(f"efficiency (examples {bss.SMALL_BATCH} needed / "
                     "taken)")
    right.set_title(f"where {bss.SMALL_BATCH}'s own loss falls by more than "
                    f"{TOLERANCE:g} over the epoch", fontsize=9)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (rate linear in the batch, constant)")
        ax.legend(fontsize=8)
    fig.suptitle("Branched probes from the small batch's checkpoints "
                 f"(dashed: {C:g} x B_simple; dotted: McCandlish's fit; grey: "
                 "the tolerance)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(record, out):
    with open(out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(markdown(record))
    if analyse(record["probes"]):
        plot(record, out + ".png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--work_dir", default=os.path.join("runs", "probes"))
    p.add_argument("--data_dir", default="")
    p.add_argument("--report_only", action="store_true")
    args = p.parse_args(argv)
    record = {"probes": []}
    if os.path.exists(args.out + ".json"):
        with open(args.out + ".json") as f:
            record = json.load(f)
    record.update(updated=datetime.date.today().isoformat())
    if args.report_only:
        write_outputs(record, args.out)
        return 0
    record.update(machine=bss._this_machine(),
                  backend=os.environ.get("KERAS_BACKEND", "jax"),
                  command="python " + " ".join(
                      ["bench/critical_batch_probe.py",
                       *(argv or sys.argv[1:])]))
    run_base(args.work_dir, args.data_dir)
    done = {probe_key(r) for r in record["probes"]}
    for spec in probe_specs():
        if probe_key(spec) in done:
            continue
        print(f"probe {probe_key(spec)}", flush=True)
        record["probes"].append(run_probe(spec, args.work_dir,
                                          args.data_dir))
        write_outputs(record, args.out)
    write_outputs(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
