"""Updates to a target accuracy against the batch, the rate tuned at each
batch over seeds (Shallue et al. 2018, arXiv:1811.03600), and the grown
batch beside it.

The workload: ResNet-8 of width 4 on Fashion-MNIST, SGD (momentum 0.9),
warmup + polynomial decay, batch norm over micro-batches of 256 (gradients
accumulated above that), 24 epochs; validation 4 times an epoch
(`--evals_per_epoch=4`), so the updates to 0.88 and 0.90 are read at a
quarter epoch: the first evaluation at or above the target and the one
before it, linearly interpolated in updates (`updates_to`).

The plan (`plan`), in order of value, each step once the runs it reads are
done:

1. fixed batches 1,024, 512, 2,048, 256, 4,096 (`BATCHES`), each at 4 peak
   rates log-spaced by 2 (`sweep_rates`), seed 0;
2. the grown batch (`GROWN`: `--adaptive_batch=noise_scale` variants from
   128 at 0.2), seed 0;
3. a sweep whose best rate (fewest updates to 0.90, then final accuracy)
   sits at an edge is extended by one rate that way, up to twice;
4. each batch's best rate with seeds 1 and 2 (`TUNED_SEEDS`; more with
   `--tuned_seeds`);
5. the small batch, 128 at its tuned 0.2, seeds 0-2 (quarter-epoch evals);
6. the grown variants with seed 1, the default (and those `--follow`
   names) with seeds 2-4;
7. the 12-epoch budget (`SECOND_EPOCHS`), a workload the defaults were not
   tuned on: `SECOND_BATCHES` each at its 24-epoch best rate x 1/2, 1, 2
   (seed 0), the best of them with seeds 1 and 2, the command's default
   grown batch (and the variants `--follow` names) with seeds 0-2, and the
   small batch (128 at 0.2, the
   accuracy the floor keeps) with seeds 0-2;
8. the same for a normalised optimizer (`NORMALISED`, LARSMixed, its rate
   tuned at 128 `NORMALISED_RATE`): each batch's sweep (4 rates 2x apart
   around the small rate scaled by the square root of the batch, bracketed
   alike), its best rate with seed 1 (`NORMALISED_SEEDS`), and the grown
   batch (`NORMALISED_GROWN`: the command's defaults, the `auto` rule
   leaving the rate unchanged, and the same from the small batch) with
   seeds 0-2.

Finished runs are kept in `<out>.json` and skipped on a rerun; the study
runs `--workers` processes at a time (2 on a 2-core CPU; the GPU campaign's
part c hands the same plan to its workers). `<out>.md` holds the tables
(each row a configuration over its seeds: n, final accuracy mean and
standard deviation, median updates to each target with a seed that never
gets there counted as infinite; a variant that runs as another until a late
change, seed by seed against it: `PAIRED`), `<out>.png` the curve of updates
to 0.90 against the batch (median, range over seeds) and the median accuracy
against updates of each batch's best rate and the grown batch (those with
`PLOTTED_SEEDS` seeds or more).

    KERAS_BACKEND=jax python bench/batch_scaling_study.py --workers 2
    python bench/batch_scaling_study.py --report_only
"""

import argparse
import concurrent.futures
import csv
import datetime
import json
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import large_batch_study as lbs  # noqa: E402
import seeds  # noqa: E402

OUT = os.path.join(lbs.RESULTS, "batch_scaling_study")
EPOCHS, SECOND_EPOCHS = 24, 12
SMALL_BATCH, SMALL_RATE = 128, 0.2
OPTIMIZER_NAMES = {"sgd": "SGD", "lars_mixed": "LARSMixed"}
# The normalised optimizer of step 8 and its rate tuned at 128 (8 epochs,
# bench/large_batch_study.py: 10 * sqrt(2)); None: no step 8.
NORMALISED, NORMALISED_RATE = "lars_mixed", 10 * 2 ** 0.5
NORMALISED_SEEDS, NORMALISED_GROWN_SEEDS = (0, 1), (0, 1, 2)
MICRO_BATCH = 256
BATCHES = (1024, 512, 2048, 256, 4096)
MAX_BATCH = 4096
TARGETS = (0.88, 0.90)
EVALS_PER_EPOCH = 4
SEEDS, GROWN_SEEDS = (0, 1, 2), (0, 1, 2, 3, 4)
# The seeds of each fixed batch's best rate (`--tuned_seeds`).
TUNED_SEEDS = SEEDS
# The command's defaults until 2026-11-26 (adaptive_batch.defaults.PREVIOUS),
# spelled out, up to MAX_BATCH.
PREVIOUS = {"noise_scale_multiple": 1.0, "adaptive_learning_rate": "sqrt",
            "adaptive_start_multiple": 1, "max_global_batch_size": MAX_BATCH}
# The grown batch's variants: (name, command flags beside
# `--adaptive_batch=noise_scale`, each spelled out so that a change of the
# command's defaults leaves it as it ran). The first is the command's
# defaults: only the small batch and its rate given.
GROWN = (
    ("default", {}),
    ("previous", PREVIOUS),
    ("c2", dict(PREVIOUS, noise_scale_multiple=2.0)),
    ("c4", dict(PREVIOUS, noise_scale_multiple=4.0)),
    ("c8", dict(PREVIOUS, noise_scale_multiple=8.0)),
    ("linear", dict(PREVIOUS, adaptive_learning_rate="linear")),
    # Starts at 4 x the small batch (8 micro-batches), the rate x sqrt(4).
    ("start4", dict(PREVIOUS, start=4)),
    # Starts at 512 with the rate 4 x (0.8, 512's tuned rate), follows
    # 4 x B_simple with the rate linear in the batch, up to 1,024 (1.6):
    # today's defaults, with the start as a larger first batch.
    ("start4_c4_linear_1024", dict(PREVIOUS, start=4, noise_scale_multiple=4.0,
                                   adaptive_learning_rate="linear",
                                   max_global_batch_size=1024)),
    # As today's defaults with c = 2: 512 until 2 x B_simple rounds to
    # 1,024, later in the run.
    ("start4_c2_linear_1024", dict(PREVIOUS, start=4, noise_scale_multiple=2.0,
                                   adaptive_learning_rate="linear",
                                   max_global_batch_size=1024)),
    # As today's defaults, and over the last quarter back to 512 (the
    # first batch, 1 x the compiled one here), the rate with it: the end of
    # the decay at a batch the fixed ones anneal well at.
    ("anneal", dict(PREVIOUS, start=4, noise_scale_multiple=4.0,
                    adaptive_learning_rate="linear",
                    max_global_batch_size=1024,
                    adaptive_anneal_fraction=0.25,
                    adaptive_anneal_multiple=1)),
    # The same over the last half of the epochs.
    ("anneal_half", dict(PREVIOUS, start=4, noise_scale_multiple=4.0,
                         adaptive_learning_rate="linear",
                         max_global_batch_size=1024,
                         adaptive_anneal_fraction=0.5,
                         adaptive_anneal_multiple=1)),
)
# The normalised optimizer's grown variants, as GROWN's: the command's
# defaults, and from the small batch (today's defaults but the start).
NORMALISED_GROWN = (
    ("default", {}),
    ("start1_c4_unchanged_1024", dict(noise_scale_multiple=4.0,
                                      adaptive_learning_rate="unchanged",
                                      adaptive_start_multiple=1,
                                      max_global_batch_size=1024)),
)
# Variants that run as another until a late change (the anneal): their runs
# compare seed by seed with that one's on the same machine, identical up to
# the change, so the difference is the change's alone (`_paired`).
PAIRED = {"anneal": "start4_c4_linear_1024",
          "anneal_half": "start4_c4_linear_1024"}
# The plot draws a grown configuration from this many seeds on.
PLOTTED_SEEDS = 3
# How the plot names a variant (else "grown <name>").
LABELS = {"default": "grown, today's defaults",
          "start4_c4_linear_1024": "grown from 4x, c 4, linear, up to 8x "
                                   "(today's defaults)",
          "anneal": "grown as today's defaults, the last quarter at 4x",
          "anneal_half": "grown as today's defaults, the last half at 4x",
          "previous": "grown, the previous defaults (c 1, sqrt)"}
# The second workload's fixed batches (the 24-epoch study's two best), each
# swept around its 24-epoch best rate (x 1/2, 1, 2).
SECOND_BATCHES = (512, 1024)
WORKLOAD = dict(model="resnet_cifar", depth=8, width=4,
                dataset="fashion_mnist", weight_decay=5e-4,
                label_smoothing=0.1, bn_momentum=0.9)
STEPS_PER_EPOCH = 0  # 0: the whole data set.
# Grown variants run with every seed of GROWN_SEEDS, as the default is
# (the others: seeds 0 and 1).
FOLLOW = ()


def configure(**sizes):
    """Sets this module's sizes (`EPOCHS`, `BATCHES`, `STEPS_PER_EPOCH`, ...)
    by name: the GPU campaign's smoke run uses tiny ones, in the parent and
    its workers alike."""
    for name, value in sizes.items():
        if name not in SIZES:
            raise ValueError(f"`{name}` is not one of {SIZES}")
        globals()[name] = tuple(
            tuple(v) if name == "GROWN" else v for v in value
        ) if isinstance(value, list) else value


SIZES = ("EPOCHS", "SECOND_EPOCHS", "SMALL_BATCH", "MICRO_BATCH", "BATCHES",
         "MAX_BATCH", "SEEDS", "GROWN_SEEDS", "TUNED_SEEDS",
         "STEPS_PER_EPOCH",
         "EVALS_PER_EPOCH", "GROWN", "FOLLOW", "NORMALISED",
         "SECOND_BATCHES")


def small_rate(optimizer):
    """The rate tuned at `SMALL_BATCH` for `optimizer`."""
    return SMALL_RATE if optimizer == "sgd" else NORMALISED_RATE


def sweep_rates(batch, optimizer="sgd"):
    """4 rates, 2x apart, c/4, c/2, c, 2c, around c: for SGD the linearly
    scaled small-batch rate (capped at 1.6), for the normalised optimizer
    the small-batch rate times sqrt(batch / SMALL_BATCH)."""
    if optimizer == "sgd":
        center = min(SMALL_RATE * batch / SMALL_BATCH, 1.6)
    else:
        center = small_rate(optimizer) * math.sqrt(batch / SMALL_BATCH)
    return [center * f for f in (0.25, 0.5, 1.0, 2.0)]


def run_key(r):
    key = (f"{r['kind']}|{r['optimizer']}|{r['epochs']}|{r['batch']}|"
           f"{r['rate']:.6g}|{r['seed']}")
    return key + (f"|{r['variant']}" if r["kind"] == "grown" else "")


def fixed_spec(batch, rate, seed, epochs=None, optimizer="sgd"):
    epochs = epochs or EPOCHS
    _, warmup = lbs.recipe_default(optimizer, batch, epochs)
    return dict(kind="fixed", phase="fixed", optimizer=optimizer, batch=batch,
                rate=rate, seed=seed, epochs=epochs, warmup_epochs=warmup)


def grown_spec(variant, seed, epochs=None, optimizer="sgd"):
    epochs = epochs or EPOCHS
    _, warmup = lbs.recipe_default(optimizer, SMALL_BATCH, epochs)
    return dict(kind="grown", phase="grown", optimizer=optimizer,
                batch=SMALL_BATCH, rate=small_rate(optimizer), seed=seed,
                epochs=epochs, warmup_epochs=warmup, variant=variant)


def _args(work_dir, data_dir):
    return argparse.Namespace(
        **WORKLOAD, replica_batch=MICRO_BATCH, steps_per_epoch=STEPS_PER_EPOCH,
        data_dir=data_dir, work_dir=work_dir)


def model_dir_of(spec, work_dir):
    return os.path.join(work_dir, run_key(spec).replace("|", "_"))


def train_argv(spec, work_dir, data_dir=""):
    """The command's arguments of one run."""
    argv = [a for a in lbs.train_argv(spec, _args(work_dir, data_dir))
            if not a.startswith(("--model_dir=",
                                 "--gradient_accumulation_steps="))]
    argv += [f"--model_dir={model_dir_of(spec, work_dir)}",
             f"--evals_per_epoch={EVALS_PER_EPOCH}"]
    if spec["kind"] == "fixed":
        k = max(1, spec["batch"] // MICRO_BATCH)
        return argv + [f"--gradient_accumulation_steps={k}"]
    # The grown batch starts as 2 micro-batches of half the small batch
    # (Keras accumulates only from 2); `start` makes that batch larger.
    flags = dict(dict(GROWN + NORMALISED_GROWN)[spec["variant"]])
    start = flags.pop("start", 1)
    if start != 1:
        argv = [a for a in argv if not a.startswith(
            ("--global_batch_size=", "--base_learning_rate="))]
        # The starting rate follows the variant's rule (sqrt: the default).
        linear = flags.get("adaptive_learning_rate") == "linear"
        factor = start if linear else start ** 0.5
        argv += [f"--global_batch_size={SMALL_BATCH * start}",
                 f"--base_learning_rate={spec['rate'] * factor:g}"]
    argv += [f"--gradient_accumulation_steps={2 * start}",
             "--adaptive_batch=noise_scale"]
    return argv + [f"--{name}={value}" for name, value in flags.items()]


def collect(spec, work_dir, wall_seconds):
    """The run's record: the study's (`large_batch_study.collect`) and the
    evaluations within epochs, [(epoch, updates, val_accuracy), ...]."""
    model_dir = model_dir_of(spec, work_dir)
    record = lbs.collect(spec, _args(work_dir, ""), wall_seconds, model_dir)
    with open(os.path.join(model_dir, "evals.csv"), newline="") as f:
        record["evals"] = [
            [float(r["epoch"]), float(r["updates"]), float(r["val_accuracy"])]
            for r in csv.DictReader(f)]
    return record


# ------------------------------------------------------------ aggregation


def updates_to(evals, target):
    """Updates at which the accuracy first reaches `target`, from `evals`
    [(epoch, updates, accuracy), ...] (`seeds.updates_to`)."""
    return seeds.updates_to([(u, a) for _, u, a in evals], target)


median_updates = seeds.median_updates


def config_key(r):
    """A configuration: everything but the seed."""
    return (r["kind"], r["epochs"], r["batch"], round(r["rate"], 9),
            r.get("variant"), r["optimizer"])


def summarize(runs):
    """{config_key: summary} over seeds (`seeds.aggregate`), with the
    configuration's fields and each seed's updates."""
    found = seeds.aggregate(runs, config_key, TARGETS,
                            lambda r, t: updates_to(r["evals"], t))
    by_key = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        by_key.setdefault(config_key(r), []).append(
            r.get("updates") or round(r["num_train"] / r["batch"])
            * r["epochs"])
    return {key: dict(s, kind=key[0], epochs=key[1], batch=key[2],
                      rate=key[3], variant=key[4], optimizer=key[5],
                      updates=by_key[key])
            for key, s in found.items()}


def _rank(s):
    """Fewest median updates to the last target, then highest mean final
    accuracy (smaller sorts first)."""
    to = s["median_to"][TARGETS[-1]]
    return (math.inf if to is None else to, -s["mean"])


def best_rate(summaries, batch, epochs=None, optimizer="sgd"):
    """The summary of `batch`'s best rate for `optimizer` on seed 0
    (`_rank`), None before any run."""
    epochs = epochs or EPOCHS
    pool = [s for s in summaries.values() if s["kind"] == "fixed"
            and s["batch"] == batch and s["epochs"] == epochs
            and s["optimizer"] == optimizer and 0 in s["seeds"]]
    seed0 = [dict(s, median_to={t: s["updates_to"][t][s["seeds"].index(0)]
                                for t in TARGETS},
                  mean=s["final"][s["seeds"].index(0)]) for s in pool]
    return min(seed0, key=_rank) if seed0 else None


# ------------------------------------------------------------------- plan


def plan(runs, busy=()):
    """Yields the specs to run next, in order of value (module docstring);
    a step that reads a sweep waits for it (no run of it in `busy`)."""
    done = {run_key(r) for r in runs}
    pending = {run_key(s) for s in busy}
    summaries = summarize(runs)

    def new(spec):
        return run_key(spec) not in done and run_key(spec) not in pending

    def sweeps(optimizer):
        for batch in BATCHES:
            for rate in sweep_rates(batch, optimizer):
                yield fixed_spec(batch, rate, 0, optimizer=optimizer)

    def tuned(optimizer, seeds):
        """Each swept batch's bracket extension, else its best rate with
        `seeds`."""
        for batch in BATCHES:
            swept = [fixed_spec(batch, rate, 0, optimizer=optimizer)
                     for rate in sweep_rates(batch, optimizer)]
            if not all(run_key(s) in done for s in swept) or any(
                    s["kind"] == "fixed" and s["batch"] == batch
                    and s["optimizer"] == optimizer and s["seed"] == 0
                    for s in busy):
                continue
            edge = _bracket_edge(summaries, batch, optimizer)
            if edge is not None:
                yield fixed_spec(batch, edge, 0, optimizer=optimizer)
                continue
            top = best_rate(summaries, batch, optimizer=optimizer)["rate"]
            for seed in seeds:
                yield fixed_spec(batch, top, seed, optimizer=optimizer)

    def second_workload():
        """Each of SECOND_BATCHES swept around its 24-epoch best rate, its
        best here with the other seeds; the default grown batch."""
        for batch in SECOND_BATCHES:
            top = best_rate(summaries, batch)
            if top is None:
                continue
            swept = [fixed_spec(batch, top["rate"] * f, 0, SECOND_EPOCHS)
                     for f in (0.5, 1.0, 2.0)]
            yield from swept
            if all(run_key(s) in done for s in swept) and not any(
                    run_key(s) in pending for s in swept):
                best = best_rate(summaries, batch, SECOND_EPOCHS)["rate"]
                for seed in SEEDS[1:]:
                    yield fixed_spec(batch, best, seed, SECOND_EPOCHS)
        for variant in (GROWN[0][0], *FOLLOW):
            for seed in SEEDS:
                yield grown_spec(variant, seed, SECOND_EPOCHS)
        for seed in SEEDS:
            yield fixed_spec(SMALL_BATCH, SMALL_RATE, seed, SECOND_EPOCHS)

    def steps():
        yield from sweeps("sgd")
        for variant, _ in GROWN:
            yield grown_spec(variant, 0)
        yield from tuned("sgd", TUNED_SEEDS[1:])
        for seed in SEEDS:
            yield fixed_spec(SMALL_BATCH, SMALL_RATE, seed)
        for seed in GROWN_SEEDS[1:]:
            for variant, _ in GROWN:
                if (seed < 2 or variant == GROWN[0][0]
                        or variant in FOLLOW):
                    yield grown_spec(variant, seed)
        yield from second_workload()
        if NORMALISED:
            yield from sweeps(NORMALISED)
            yield from tuned(NORMALISED, NORMALISED_SEEDS[1:])
            for variant, _ in NORMALISED_GROWN:
                for seed in NORMALISED_GROWN_SEEDS:
                    yield grown_spec(variant, seed, optimizer=NORMALISED)

    for spec in steps():
        if new(spec):
            yield spec


def _bracket_edge(summaries, batch, optimizer):
    """The rate that extends `batch`'s sweep by one step (2x) past the
    edge its best rate sits at, at most twice each way; None when the best
    is inside."""
    rates = sorted(s["rate"] for s in summaries.values()
                   if s["kind"] == "fixed" and s["batch"] == batch
                   and s["epochs"] == EPOCHS and s["optimizer"] == optimizer)
    top = best_rate(summaries, batch, optimizer=optimizer)["rate"]
    base = sweep_rates(batch, optimizer)
    if top == rates[0] and rates[0] > base[0] / 4 * 1.0001:
        return rates[0] / 2
    if top == rates[-1] and rates[-1] < base[-1] * 4 * 0.9999:
        return rates[-1] * 2
    return None


# ----------------------------------------------------------------- report


def _fmt_to(s, t):
    m = s["median_to"][t]
    return (f"{m:,.0f}" if m is not None else "never") + \
        f" ({s['reached'][t]}/{s['n']})"


def _fmt_acc(s):
    sd = "" if s["sd"] is None else f" ± {s['sd']:.4f}"
    return f"{s['mean']:.4f}{sd}"


def markdown(record):
    summaries = summarize(record["runs"])
    lines = [
        "# Updates to a target against the batch (Fashion-MNIST, ResNet-8 "
        "w4)", "",
        "Runs: " + "; ".join(f"{n} on {m}" for m, n in _machines(record))
        + f". Backend: {record.get('backend', '?')}. Updated "
        f"{record.get('updated', '?')}. Command: "
        f"`{record.get('command', '?')}`.", "",
        "Each row: one configuration over its seeds (n). Final accuracy: mean"
        " ± sample standard deviation (none for n = 1: one seed decides "
        "nothing). Updates to a target: the median over seeds, a seed that "
        "never reaches it counted as infinite, with the seeds that did; read "
        "from 4 evaluations an epoch, linearly interpolated.", ""]
    groups = sorted({(s["optimizer"] != "sgd", s["optimizer"], s["epochs"])
                     for s in summaries.values()},
                    key=lambda g: (g[0], g[1], -g[2]))
    for _, optimizer, epochs in groups:
        lines += [f"## {OPTIMIZER_NAMES.get(optimizer, optimizer)}, "
                  f"{epochs} epochs", "",
                  "| run | batch | rate | n | final val acc | updates | "
                  + " | ".join(f"updates to {t}" for t in TARGETS) + " |",
                  "|---|---|---|---|---|---|" + "---|" * len(TARGETS)]
        rows = sorted((s for s in summaries.values() if s["epochs"] == epochs
                       and s["optimizer"] == optimizer),
                      key=lambda s: (s["kind"], s["batch"], s["rate"],
                                     s["variant"] or ""))
        for s in rows:
            name = "fixed" if s["kind"] == "fixed" else f"grown, {s['variant']}"
            updates = (f"{min(s['updates']):,}–{max(s['updates']):,}"
                       if min(s["updates"]) != max(s["updates"])
                       else f"{s['updates'][0]:,}")
            lines.append(
                f"| {name} | {s['batch']:,} | {s['rate']:g} | {s['n']} | "
                f"{_fmt_acc(s)} | {updates} | "
                + " | ".join(_fmt_to(s, t) for t in TARGETS) + " |")
        lines.append("")
    return "\n".join(lines + _above(record, summaries)
                     + _by_epoch(record["runs"]) + _paired(record["runs"]))


def _by_epoch(runs, every=4, min_seeds=3):
    """Lines: the mean validation accuracy at the end of every `every`-th
    epoch of each SGD configuration of EPOCHS epochs with `min_seeds` seeds
    or more (where along the run one configuration passes another)."""
    by_key = {}
    for r in runs:
        if r["epochs"] == EPOCHS and r["optimizer"] == "sgd":
            by_key.setdefault(config_key(r), {})[r["seed"]] = r
    rows = sorted((k for k, g in by_key.items() if len(g) >= min_seeds),
                  key=lambda k: (k[0], k[2], k[3], k[4] or ""))
    if not rows:
        return []
    epochs = list(range(every, EPOCHS + 1, every))
    lines = [f"## Mean validation accuracy by epoch ({EPOCHS} epochs, "
             f"configurations with {min_seeds} seeds or more)", "",
             "| run | n | " + " | ".join(f"epoch {e}" for e in epochs) + " |",
             "|---|---|" + "---|" * len(epochs)]
    for key in rows:
        group = list(by_key[key].values())
        name = (f"fixed {key[2]:,} @ {key[3]:g}" if key[0] == "fixed"
                else f"grown, {key[4]}")
        means = [sum(r["val_accuracy_per_epoch"][e - 1] for r in group)
                 / len(group) for e in epochs]
        lines.append(f"| {name} | {len(group)} | "
                     + " | ".join(f"{m:.4f}" for m in means) + " |")
    return lines + [""]


def _median_of(group):
    """(updates, median accuracy) of a configuration's seeds, each seed's
    curve interpolated onto the first seed's updates."""
    import numpy as np

    grid = np.array([e[1] for e in group[0]["evals"]])
    return grid, np.median([np.interp(grid, [e[1] for e in r["evals"]],
                                      [e[2] for e in r["evals"]])
                            for r in group], axis=0)


def _paired(runs):
    """Lines: each `PAIRED` variant against its base, seed by seed (the
    same seed, epochs, optimizer and machine): the final accuracy's and the
    updates to TARGETS[-1]'s differences, and their mean and spread."""
    import statistics

    def key(r):
        return (r["seed"], r["epochs"], r["optimizer"], r.get("machine"))

    lines = []
    for variant, base in PAIRED.items():
        bases = {key(r): r for r in runs if r.get("variant") == base}
        pairs = sorted(((r, bases[key(r)]) for r in runs
                        if r.get("variant") == variant and key(r) in bases),
                       key=lambda p: (p[0]["epochs"], p[0]["seed"]))
        if not pairs:
            continue
        if not lines:
            lines = [f"## Paired by seed: a variant against the one it runs "
                     f"as until its change", "",
                     "| variant | against | epochs | seeds | final val acc, "
                     "each seed's difference | mean ± sd | updates to "
                     f"{TARGETS[-1]}, each seed's difference |",
                     "|---|---|---|---|---|---|---|"]
        for epochs in sorted({a["epochs"] for a, _ in pairs}):
            group = [(a, b) for a, b in pairs if a["epochs"] == epochs]
            diffs = [a["val_accuracy"] - b["val_accuracy"] for a, b in group]
            spread = (f" ± {statistics.stdev(diffs):.4f}"
                      if len(diffs) > 1 else " (one seed)")
            to = []
            for a, b in group:
                ua = updates_to(a["evals"], TARGETS[-1])
                ub = updates_to(b["evals"], TARGETS[-1])
                to.append("never" if ua is None or ub is None
                          else f"{ua - ub:+,.0f}")
            lines.append(
                f"| {variant} | {base} | {epochs} | "
                + ", ".join(str(a["seed"]) for a, _ in group) + " | "
                + ", ".join(f"{d:+.4f}" for d in diffs) + " | "
                + f"{statistics.fmean(diffs):+.4f}{spread} | "
                + ", ".join(to) + " |")
    return lines + [""] if lines else []


def _above(record, summaries):
    """Lines: for each grown configuration with 3 seeds or more, the share
    of its evaluations, from its median's first at or above TARGETS[0] to
    its last, where its median accuracy is at or above each fixed batch's
    best rate's median (interpolated in updates; beyond a fixed batch's
    last update, its final accuracy)."""
    import numpy as np

    by_key = {}
    for r in record["runs"]:
        by_key.setdefault(config_key(r), []).append(r)
    grown = [k for k, g in by_key.items() if k[0] == "grown"
             and k[1] == EPOCHS and k[5] == "sgd" and len(g) >= 3]
    fixed = {b: best_rate(summaries, b) for b in BATCHES}
    fixed = {b: s for b, s in sorted(fixed.items()) if s is not None}
    if not grown or not fixed:
        return []
    lines = [f"## The grown batch's median accuracy against the fixed "
             f"batches', from {TARGETS[0]} on", "",
             "Share of the grown configuration's evaluations, from its median's"
             f" first at or above {TARGETS[0]} to its end, where its median "
             "accuracy (over seeds, interpolated in updates) is at or above "
             "that of each fixed batch's best rate (its final accuracy "
             "beyond its last update).", "",
             "| grown | n | " + " | ".join(f"fixed {b:,} @ {s['rate']:g} "
                                          f"(n={s['n']})"
                                          for b, s in fixed.items()) + " |",
             "|---|---|" + "---|" * len(fixed)]
    for key in grown:
        grid, median = _median_of(by_key[key])
        start = int(np.argmax(median >= TARGETS[0]))
        if median[start] < TARGETS[0]:
            continue
        grid, median = grid[start:], median[start:]
        shares = []
        for s in fixed.values():
            fx, fm = _median_of(by_key[config_key(s)])
            other = np.interp(grid, fx, fm)
            shares.append(f"{np.mean(median >= other):.0%}")
        lines.append(f"| {key[4]} | {len(by_key[key])} | "
                     + " | ".join(shares) + " |")
    return lines + [""]


def _machines(record):
    """[(machine, runs), ...]: where the runs ran (a run's own `machine`,
    else the record's)."""
    counts = {}
    for r in record["runs"]:
        m = r.get("machine") or record.get("machine", "?")
        counts[m] = counts.get(m, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


def plot(record, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    summaries = summarize(record["runs"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 6.5))
    reference = _reference_runs()
    best = {}  # optimizer -> [(batch, summary)] of the curve
    never = []
    for optimizer in sorted({s["optimizer"] for s in summaries.values()},
                            key=lambda o: o != "sgd"):
        points = []
        for batch in sorted({SMALL_BATCH, *BATCHES}):
            pool = [s for s in summaries.values() if s["kind"] == "fixed"
                    and s["batch"] == batch and s["epochs"] == EPOCHS
                    and s["optimizer"] == optimizer]
            if not pool:
                continue
            s = min(pool, key=lambda s: (-s["n"], _rank(s)))
            values = [v for v in s["updates_to"][TARGETS[-1]]
                      if v is not None]
            if s["median_to"][TARGETS[-1]] is None or not values:
                never.append(batch)
                continue
            points.append((batch, s["median_to"][TARGETS[-1]], min(values),
                           max(values), s))
        name = OPTIMIZER_NAMES.get(optimizer, optimizer)
        if optimizer == "sgd" and reference.get("fixed"):
            # Fixed 128 over its seeds, an epoch's grain (no run here).
            values = reference["fixed"]
            m = seeds.median_updates(values)
            if m is not None and SMALL_BATCH not in [p[0] for p in points]:
                done = [v for v in values if v is not None]
                points.insert(0, (SMALL_BATCH, m, min(done), max(done),
                                  None))
        if not points:
            continue
        best[optimizer] = [(p[0], p[4]) for p in points if p[4] is not None]
        b, m, lo, hi, _ = zip(*points)
        ax.errorbar(b, m, yerr=[[x - y for x, y in zip(m, lo)],
                                [y - x for x, y in zip(m, hi)]],
                    marker="o", capsize=3, label=f"{name} fixed, best rate")
        if optimizer == "sgd":
            ax.plot(b, [m[0] * b[0] / x for x in b], "k--", lw=0.8,
                    label="perfect scaling")
    if never:
        top = max((line.get_ydata().max() for line in ax.get_lines()),
                  default=1000) * 1.5
        ax.plot(sorted(set(never)), [top] * len(set(never)), "r^", ms=9,
                label=f"median never reaches {TARGETS[-1]} (at any rate)")
    grown = [(LABELS.get(s["variant"], f"grown {s['variant']}")
              + ("" if s["optimizer"] == "sgd"
                 else f", {OPTIMIZER_NAMES.get(s['optimizer'])}"),
              s["n"], [v for v in s["updates_to"][TARGETS[-1]]])
             for s in summaries.values()
             if s["kind"] == "grown" and s["epochs"] == EPOCHS
             and s["n"] >= PLOTTED_SEEDS]
    if reference.get("grown"):
        grown.append((LABELS["previous"] + ", an epoch's grain",
                      len(reference["grown"]), reference["grown"]))
    for i, (label, n, values) in enumerate(grown):
        m = seeds.median_updates(values)
        if m is None:
            continue
        color = f"C{(i + 2) % 10}"
        ax.axhline(m, ls=":", lw=1.2, color=color, label=f"{label} (n={n})")
        done = [v for v in values if v is not None]
        if n > 1:
            ax.axhspan(min(done), max(done), alpha=0.08, color=color)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel(f"updates to {TARGETS[-1]} (median; bars: range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13),
              ncol=2)
    by_key = {}
    for r in record["runs"]:
        by_key.setdefault(config_key(r), []).append(r)
    for batch, s in best.get("sgd", []):
        _median_curve(bx, by_key[config_key(s)],
                      f"fixed {batch} @ {s['rate']:g}")
    for key, group in by_key.items():
        if (key[0] == "grown" and key[1] == EPOCHS and key[5] == "sgd"
                and len(group) >= PLOTTED_SEEDS):
            _median_curve(bx, group, LABELS.get(key[4], f"grown {key[4]}")
                          + f" (n={len(group)})", ls="--")
    bx.set_xscale("log")
    bx.set_ylim(0.8, 0.92)
    bx.set_xlabel("updates")
    bx.set_ylabel("val accuracy (median over seeds; band: range)")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13),
              ncol=2)
    fig.suptitle(f"Grown batches with {PLOTTED_SEEDS} seeds or more (the "
                 "others: the tables)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _reference_runs():
    """Updates to the last target of the seeds kept in
    `adaptive_batch_seeds.json` (one evaluation an epoch; the H200's and
    two CPU seeds), configurations this study has no runs of:
    {"fixed": [fixed 128 at SMALL_RATE, per seed], "grown": [the grown
    batch's defaults, per seed]}; empty without the file."""
    path = os.path.join(lbs.RESULTS, "adaptive_batch_seeds.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        runs = json.load(f)["runs"]
    found = {}
    for r in runs:
        if (r["epochs"] != EPOCHS or r["batch"] != SMALL_BATCH
                or r["optimizer"] != "sgd"
                or abs(r["rate"] - SMALL_RATE) > 1e-9):
            continue
        if r["kind"] == "grown" and (r.get("lr_rule"), r.get("c")) != (
                "sqrt", 1.0):
            continue
        found.setdefault(r["kind"], []).append(
            r["updates_to"].get(f"{TARGETS[-1]:g}"))
    return found


def _median_curve(ax, group, label, ls="-"):
    """Median accuracy against updates over the seeds of one configuration,
    each seed's curve interpolated onto the first seed's updates."""
    import numpy as np

    grid = np.array([e[1] for e in group[0]["evals"]])
    curves = np.array([np.interp(grid, [e[1] for e in r["evals"]],
                                 [e[2] for e in r["evals"]]) for r in group])
    line, = ax.plot(grid, np.median(curves, axis=0), ls=ls,
                    label=f"{label} (n={len(group)})" if "n=" not in label
                    else label)
    if len(group) > 1:
        ax.fill_between(grid, curves.min(0), curves.max(0), alpha=0.15,
                        color=line.get_color())


def write_outputs(record, out):
    with open(out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(markdown(record) + "\n")
    if record["runs"]:
        plot(record, out + ".png")


# ------------------------------------------------------------------- main


def load(out):
    if os.path.exists(out + ".json"):
        with open(out + ".json") as f:
            return json.load(f)
    return {"runs": []}


def merge(record, runs):
    """Adds `runs` not yet in `record` (by `run_key`); how many were new."""
    have = {run_key(r) for r in record["runs"]}
    new = [r for r in runs if run_key(r) not in have]
    record["runs"] += new
    return len(new)


def one_run(spec, work_dir, data_dir):
    wall = lbs.run_command(train_argv(spec, work_dir, data_dir))
    return collect(spec, work_dir, wall)


def _this_machine():
    """'2-core x86_64 CPU VM, no GPU (JAX 0.10.2), 2026-11-26': where this
    process runs the study (a GPU's runs come from the GPU campaign)."""
    from importlib import metadata

    backend = os.environ.get("KERAS_BACKEND", "jax")
    version = "?"
    for package in {"tensorflow": ("tensorflow", "tensorflow-cpu")}.get(
            backend, (backend,)):
        try:
            version = metadata.version(package)
            break
        except metadata.PackageNotFoundError:
            continue
    name = {"jax": "JAX", "torch": "torch", "tensorflow": "TensorFlow"}
    return (f"{os.cpu_count()}-core {platform.machine()} CPU VM, no GPU "
            f"({name.get(backend, backend)} {version}), "
            f"{datetime.date.today().isoformat()}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--work_dir", default=os.path.join("runs", "scaling"))
    p.add_argument("--data_dir", default="")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", nargs="*", default=[],
                   help="run only the planned runs whose key contains one "
                        "of these (e.g. '|c4')")
    p.add_argument("--follow", nargs="*", default=[],
                   help="grown variants to run with every seed, as the "
                        "default is (e.g. c4)")
    p.add_argument("--grown_seeds", type=int, default=len(GROWN_SEEDS),
                   help="seeds 0..N-1 for the default grown batch and the "
                        "variants --follow names (default %(default)s)")
    p.add_argument("--tuned_seeds", type=int, default=len(TUNED_SEEDS),
                   help="seeds 0..N-1 for each fixed batch's best SGD rate "
                        "(default %(default)s)")
    p.add_argument("--max_runs", type=int, default=0,
                   help="stop starting runs after this many (0: all)")
    p.add_argument("--merge", nargs="*", default=[],
                   help="JSON files of other machines' runs to add")
    p.add_argument("--report_only", action="store_true")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be >= 1. Received: {args.workers}")
    for name in ("grown_seeds", "tuned_seeds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1. Received: {getattr(args, name)}")
    configure(FOLLOW=args.follow, GROWN_SEEDS=list(range(args.grown_seeds)),
              TUNED_SEEDS=list(range(args.tuned_seeds)))
    record = load(args.out)
    for path in args.merge:
        with open(path) as f:
            print(f"{path}: {merge(record, json.load(f)['runs'])} new runs")
    record.update(updated=datetime.date.today().isoformat())
    if not args.report_only:
        record.update(
            machine=_this_machine(),
            backend=os.environ.get("KERAS_BACKEND", "jax"),
            command="python " + " ".join(["bench/batch_scaling_study.py",
                                          *(argv or sys.argv[1:])]))
    else:
        write_outputs(record, args.out)
        return 0
    started = 0
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        busy = {}
        while True:
            while len(busy) < args.workers and (
                    not args.max_runs or started < args.max_runs):
                spec = next((s for s in plan(record["runs"],
                                             list(busy.values()))
                             if not args.only or any(
                                 o in run_key(s) for o in args.only)), None)
                if spec is None:
                    break
                busy[pool.submit(one_run, spec, args.work_dir,
                                 args.data_dir)] = spec
                started += 1
                print(f"start {run_key(spec)}", flush=True)
            if not busy:
                break
            finished, _ = concurrent.futures.wait(
                busy, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                spec = busy.pop(future)
                run = dict(future.result(), host=platform.node(),
                           machine=record["machine"],
                           finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
                record["runs"].append(run)
                print(f"done {run_key(spec)}: val {run['val_accuracy']:.4f}",
                      flush=True)
                write_outputs(record, args.out)
    write_outputs(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
