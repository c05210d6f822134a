"""Every study as a plan: arms x seeds x budgets, as data.

A plan is a `Plan` (`bench/core/plan.py`): its name, the record it writes
(`bench/results/<record>.json`, which the report reads), and its run specs
(`bench/core/runspec.py`) in order of value: training runs or a program's
(`kills`). A plan whose later runs depend on earlier results (the best rate
of a sweep, measured on other seeds) gives them through `then(runs)`,
which returns nothing until the runs it reads are done. The GPU check's
tasks are its own plans (`bench/gpu_campaign/plan.py`).

Seeds 0-9 were spent before the study chose rates by rule; new
measurements use seeds from 100 on, decided here before they run.
"""

import math
import os
import typing

from bench.core import provenance
from bench.core import runspec
from bench.core.plan import Plan
from bench.study import kills
from bench.study import stats
from keras_largebatch.train import layout
from keras_largebatch.train.recipe import rates as recipe_rates

SMALL_BATCH, MICRO = 128, 256


def points(r):
    """A run's [(updates, accuracy), ...]: its evaluations within epochs,
    else one at the end of each epoch."""
    if r.get("evals"):
        return [(u, a) for _, u, a in r["evals"]]
    per = r["num_train"] // r["batch"] if "num_train" in r else None
    return [((i + 1) * per, a) for i, a in enumerate(
        r.get("val_accuracy_per_epoch", []))] if per else []


def best_rate(runs, target):
    """The rate of `runs` (one batch and optimizer, the choosing seeds) with
    the fewest median updates to `target`, then the highest mean final
    accuracy."""
    by_rate = {}
    for r in runs:
        by_rate.setdefault(round(r["rate"], 9), []).append(r)

    def rank(group):
        to = stats.median([stats.updates_to(points(r), target) for r in group])
        return (to, -sum(r["val_accuracy"] for r in group) / len(group))

    return min(by_rate, key=lambda rate: rank(by_rate[rate]))


def sweep_best(swept, target=0.90):
    """(`best_rate` of a sweep's runs, "lower" / "upper" where it is the
    sweep's lowest / highest rate, else None): a best at an edge was not
    bracketed by the sweep."""
    best = best_rate(swept, target)
    rates = sorted({round(r["rate"], 9) for r in swept})
    return best, ("lower" if best == rates[0] else
                  "upper" if best == rates[-1] else None)


def fixed(batch, rate, seeds, epochs=24, optimizer="sgd", warmup_epochs=None,
          **extra):
    """A fixed batch at one peak rate over `seeds`, the recipe's warmup
    (or `warmup_epochs`)."""
    warmup = recipe_rates.warmup_epochs_for(optimizer, "auto", batch, epochs,
                                      warmup_epochs)
    return [dict(extra, kind="fixed", phase="fixed", optimizer=optimizer,
                 batch=batch, rate=rate, seed=seed, epochs=epochs,
                 warmup_epochs=warmup) for seed in seeds]


# The command's defaults until 2026-11-26, spelled out, up to 4,096.
_PREVIOUS = dict(noise_scale_multiple=1.0, adaptive_learning_rate="sqrt",
                 adaptive_start_multiple=1, max_global_batch_size=4096)
_TODAYS = dict(_PREVIOUS, noise_scale_multiple=4.0,
               adaptive_learning_rate="linear", max_global_batch_size=1024)
# A grown variant: its command flags beside `--adaptive_batch=noise_scale`
# and the multiple of the small batch it starts at (the start's rate
# follows the variant's rule). "default" is the command's defaults on the
# day its run ran (`finished` in its record).
GROWN = {
    "default": ({}, 1),
    "previous": (_PREVIOUS, 1),
    "c2": (dict(_PREVIOUS, noise_scale_multiple=2.0), 1),
    "c4": (dict(_PREVIOUS, noise_scale_multiple=4.0), 1),
    "c8": (dict(_PREVIOUS, noise_scale_multiple=8.0), 1),
    "linear": (dict(_PREVIOUS, adaptive_learning_rate="linear"), 1),
    "start4": (_PREVIOUS, 4),
    "start4_c4_linear_1024": (_TODAYS, 4),
    "start4_c2_linear_1024": (dict(_TODAYS, noise_scale_multiple=2.0), 4),
    "anneal": (dict(_TODAYS, adaptive_anneal_fraction=0.25,
                    adaptive_anneal_multiple=1), 4),
    "anneal_half": (dict(_TODAYS, adaptive_anneal_fraction=0.5,
                         adaptive_anneal_multiple=1), 4),
    "start1_c4_unchanged_1024": (dict(
        noise_scale_multiple=4.0, adaptive_learning_rate="unchanged",
        adaptive_start_multiple=1, max_global_batch_size=1024), 1),
}


def grown(variant, rate, seeds, epochs=24, optimizer="sgd"):
    """The batch grown from 128 at `rate` by `GROWN[variant]`."""
    flags, start = GROWN[variant]
    flags = dict(flags)
    if start != 1:
        linear = flags.get("adaptive_learning_rate") == "linear"
        flags.update(global_batch_size=SMALL_BATCH * start,
                     base_learning_rate=f"{rate * start ** (1 if linear else 0.5):g}",
                     gradient_accumulation_steps=2 * start)
    warmup = recipe_rates.warmup_epochs_for(optimizer, "auto", SMALL_BATCH, epochs)
    return [dict(kind="grown", phase="grown", optimizer=optimizer,
                 batch=SMALL_BATCH, rate=rate, seed=seed, epochs=epochs,
                 warmup_epochs=warmup, variant=variant, flags=flags)
            for seed in seeds]


R2 = 2 ** 0.5
# The scaling study (Shallue et al.): each fixed batch's SGD rates 2x apart
# on seed 0, its best by updates to 0.90 with seeds 1-2 (1,024: 1-4); the
# 12-epoch second workload; LARSMixed's grid from 10 sqrt(2) at 128 scaled
# by sqrt(B/128); the grown variants. Seeds 0-9, as run 2026-11-24/26.
# {batch: {rate: seeds 0..n-1}} of each fixed grid.
SCALING_FIXED = {
    128: {0.1: 1, 0.2: 3, 0.4: 3}, 256: {0.1: 1, 0.2: 1, 0.4: 1, 0.8: 3, 1.6: 1},
    512: {0.2: 1, 0.4: 1, 0.8: 1, 1.6: 3, 3.2: 1},
    1024: {0.4: 1, 0.8: 5, 1.6: 1, 3.2: 1},
    2048: {0.4: 1, 0.8: 1, 1.6: 3, 3.2: 1}, 4096: {0.4: 1, 0.8: 3, 1.6: 1, 3.2: 1}}
SECOND_FIXED = {128: {0.2: 3}, 512: {0.8: 3, 1.6: 1, 3.2: 1},
                1024: {0.4: 1, 0.8: 3, 1.6: 1}}
LARS_FIXED = {
    256: {5.0: 1, 10.0: 2, 20.0: 1, 40.0: 1},
    512: {2.5 * R2: 1, 5 * R2: 2, 10 * R2: 1, 20 * R2: 1, 40 * R2: 1},
    1024: {10.0: 1, 20.0: 2, 40.0: 1, 80.0: 1},
    2048: {5 * R2: 1, 10 * R2: 2, 20 * R2: 1, 40 * R2: 1, 80 * R2: 1},
    4096: {5.0: 1, 10.0: 2, 20.0: 1, 40.0: 1, 80.0: 1, 160.0: 1}}


def _grid(grid, **kw):
    return tuple(s for b, rates in grid.items() for r, n in rates.items()
                 for s in fixed(b, r, range(n), **kw))


SCALING_GROWN = (
    ("default", 0.2, range(3)), ("default", 0.4, range(5)),
    ("start4_c4_linear_1024", 0.2, range(10)), ("c4", 0.2, range(5)),
    *((v, 0.2, range(2)) for v in (
        "previous", "c2", "c8", "linear", "start4", "start4_c2_linear_1024",
        "anneal", "anneal_half")))
SCALING = Plan(
    "scaling", "batch_scaling_study",
    "Updates to 0.88/0.90 against the batch, rates tuned per batch; the "
    "grown batch's variants (ResNet-8 w4, Fashion-MNIST, seeds 0-9)",
    _grid(SCALING_FIXED) + _grid(SECOND_FIXED, epochs=12)
    + _grid(LARS_FIXED, optimizer="lars_mixed")
    + tuple(s for row in SCALING_GROWN for s in grown(*row))
    + tuple(grown("default", 0.2, range(3), epochs=12))
    + tuple(grown("default", 10 * R2, range(5), optimizer="lars_mixed"))
    + tuple(grown("start1_c4_unchanged_1024", 10 * R2, range(3),
                  optimizer="lars_mixed")),
    compared=True)

# The decisive comparison, fixed before it ran: the command's defaults at
# the small batch's 24-epoch rate (0.4, chosen on seeds 0-2) against fixed
# 1,024 at 0.8 (the H200 / JAX front's best for 0.90: its rate chosen on
# seed 0, one seed a rate, then repeated on seeds 1-4), on 10 seeds no rate
# was chosen on, one machine kind.
DECISIVE_SEEDS = tuple(range(100, 110))
DECISIVE = Plan(
    "decisive", "batch_scaling_study",
    "The grown batch's defaults against fixed 1,024 at 0.8, seeds 100-109",
    tuple(s for seed in DECISIVE_SEEDS for s in (
        grown("default", 0.4, [seed]) + fixed(1024, 0.8, [seed]))),
    compared=True)


def schedule_of(batch_per_epoch):
    """`--batch_schedule` of a run's batch per epoch: 'EPOCH:BATCH,...' at
    the first epoch and at each change."""
    steps = [(e, b) for e, b in enumerate(batch_per_epoch)
             if e == 0 or b != batch_per_epoch[e - 1]]
    return ",".join(f"{e}:{b}" for e, b in steps)


def batch_steps(schedule):
    """[(epoch, batch), ...] of a `--batch_schedule` text."""
    return [tuple(map(int, step.split(":"))) for step in schedule.split(",")]


def ramp(schedule, rate, seeds, epochs=24, optimizer="sgd", variant=None):
    """The grown batch's start and rate rule without its measurements:
    `--adaptive_batch=schedule` from 128 at `rate` (2 micro-batches of 64)
    along `schedule`, the rate linear in the batch (the defaults' rule for
    SGD), the recipe's warmup of the small batch as the grown runs have;
    `variant` names a ramp other than `RAMP_SCHEDULE`."""
    warmup = recipe_rates.warmup_epochs_for(optimizer, "auto", SMALL_BATCH, epochs)
    flags = dict(adaptive_batch="schedule", batch_schedule=schedule,
                 adaptive_learning_rate="linear",
                 gradient_accumulation_steps=2)
    extra = {"variant": variant} if variant else {}
    return [dict(kind="ramp", phase="ramp", optimizer=optimizer,
                 batch=SMALL_BATCH, rate=rate, seed=seed, epochs=epochs,
                 warmup_epochs=warmup, flags=flags, **extra)
            for seed in seeds]


def megatron_ramp(start, increment, end, ramp_samples, epoch_samples, epochs):
    """`--batch_schedule` of Megatron-LM's `--rampup-batch-size start
    increment ramp_samples` (`end` the global batch), read where the
    adaptive batch decides, at each epoch's start: after `s` samples the
    batch is `start + increment * floor(s / (ramp_samples / n))`, `n =
    (end - start) / increment` increments, at most `end` (in integers:
    `s * n // ramp_samples`, exact where a float division is not)."""
    n = (end - start) // increment
    batches = [min(end, start + increment * (
        e * epoch_samples * n // ramp_samples)) for e in range(epochs)]
    return schedule_of(batches)


# The grown batch against fair baselines (issue 51), on the decisive seeds
# and machine kind (CPU VM / TensorFlow), each paired with the decisive
# arms' runs. The fixed ramp is the schedule the defaults' grown runs at
# 0.4 followed on the scaling plan's seeds 0-4 (CPU VM / JAX; every one
# 512 for 4 epochs, then 1,024: `schedule_of` their `batch_per_epoch`),
# seeds the measurement does not use, written here before it runs: one
# schedule for every seed. (The decisive seeds' own grown runs took 512
# for 4 or 5 epochs.) Fixed 512 at 1.6: the CPU / JAX front's best for
# 0.90 and 0.905 (seeds 0-2; rates not rechosen on TensorFlow). Fixed
# 1,024 at 0.8 over 36 epochs: the decisive baseline with a decay that no
# longer ends before the grown runs' (1,410 updates in 24 epochs against
# their 1,642-1,701); seeds 100-104 first (`LONG_FIRST_SEEDS`), 105-109
# only if their verdicts differ from the 24-epoch arm's (the report's
# `baselines.long_rule` says whether they do). They did (2026-11-28, n = 5:
# final accuracy, 0.90 and 0.905 went from "ahead" to "cannot tell"), so
# the arm runs all 10 seeds.
RAMP_SCHEDULE = "0:512,4:1024"
LONG_FIRST_SEEDS = DECISIVE_SEEDS[:5]
BASELINE_LONG_SEEDS = DECISIVE_SEEDS
BASELINES = Plan(
    "baselines", "batch_scaling_study",
    "The defaults' baselines: a ramp written in advance, fixed 512 at 1.6, "
    "fixed 1,024 at 0.8 over 36 epochs, seeds 100-109",
    tuple(s for seed in DECISIVE_SEEDS for s in (
        ramp(RAMP_SCHEDULE, 0.4, [seed]) + fixed(512, 1.6, [seed])
        + (fixed(1024, 0.8, [seed], epochs=36)
           if seed in BASELINE_LONG_SEEDS else []))),
    compared=True)

# Ramps written without peeking (issue 60): schedules fixed from their
# shape alone, before any run of theirs, not read from the grown runs;
# against the same defaults on the decisive seeds and machine kind. A
# linear ramp from 128 to 1,024 over the first quarter of the samples
# (Megatron-LM's `--rampup-batch-size 128 128 360000`, read at epoch
# starts: 0:128,1:256,2:384,3:512,4:640,5:768,6:1024), and doubling 128 ->
# 256 -> 512 -> 1,024 at epochs 2, 4 and 6. Rate 0.4 at 128, linear in the
# batch, as the grown defaults.
FASHION_TRAIN = 60000
LINEAR_RAMP = megatron_ramp(SMALL_BATCH, SMALL_BATCH, 1024,
                            24 * FASHION_TRAIN // 4, FASHION_TRAIN, 24)
DOUBLING_RAMP = "0:128,2:256,4:512,6:1024"
# The start separated from the measurement (issue 74), fixed before it ran:
# the defaults' start (512 from the first update, rate 1.6) with no noise
# scale, 1,024 from a quarter of the samples (epoch 6), rate 0.4 x B / 128.
START_RAMP = "0:512,6:1024"
UNPEEKED_RAMPS = {"linear_ramp": LINEAR_RAMP, "doubling": DOUBLING_RAMP,
                  "start512": START_RAMP}
RAMPS = Plan(
    "ramps", "batch_scaling_study",
    "Ramps written without the noise scale (linear over a quarter of the "
    "samples; doubling at epochs 2, 4, 6) against the defaults, seeds "
    "100-109",
    tuple(s for seed in DECISIVE_SEEDS for v, sched in UNPEEKED_RAMPS.items()
          for s in ramp(sched, 0.4, [seed], variant=v)),
    compared=True)

# LARS against SGD at 4,096 (32 x 128) on ResNet-8 w4, one seed per rate
# (2026-11-22/23): 8-epoch sweeps, the best with seed 1, and 24-96 epochs.
_LBS = (
    ("short", "sgd", 8, 128, [0.0125, 0.025, 0.05, 0.1, 0.2, 0.4]),
    ("short", "sgd", 8, 4096, [0.4, 0.8, 1.6, 3.2]),
    ("short", "lars_mixed", 8, 128, [x * R2 for x in (
        0.3125, 0.625, 1.25, 2.5, 5, 10, 20)]),
    ("short", "lars_mixed", 8, 4096, [2.5, 5.0, 10.0, 20.0]),
    ("short", "lamb_mixed", 8, 128, [0.0005 * R2 * 2 ** k for k in range(-1, 7)]),
    ("short", "lamb_mixed", 8, 4096, [0.002 * 2 ** k for k in range(8)]),
    ("seed", "sgd", 8, 128, [0.2]), ("seed", "sgd", 8, 4096, [0.8]),
    ("seed", "lars_mixed", 8, 128, [10 * R2]),
    ("seed", "lars_mixed", 8, 4096, [10.0]),
    ("seed", "lamb_mixed", 8, 128, [0.016 * R2]),
    ("seed", "lamb_mixed", 8, 4096, [0.128]),
    ("long", "sgd", 24, 128, [0.2]), ("long", "sgd", 48, 128, [0.2]),
    ("long", "sgd", 96, 128, [0.2]), ("long", "sgd", 24, 4096, [0.8]),
    ("long", "sgd", 48, 4096, [0.8]), ("long", "sgd", 96, 4096, [0.8]),
    ("long", "lars_mixed", 24, 128, [10 * R2]),
    ("long", "lars_mixed", 24, 4096, [5.0, 10.0, 20.0]),
    ("long", "lars_mixed", 48, 4096, [10.0]),
    ("long", "lars_mixed", 96, 4096, [10.0]),
    ("long", "lamb_mixed", 24, 128, [0.016 * R2]),
    ("long", "lamb_mixed", 24, 4096, [0.128]),
    ("long", "lamb_mixed", 48, 4096, [0.128]))
LARS_VS_SGD = Plan(
    "lars_vs_sgd", "large_batch_study",
    "LARSMixed, LAMBMixed and SGD at 128 and 4,096 (ResNet-8 w4), one seed "
    "a rate",
    tuple(dict(phase=phase, optimizer=o, batch=b, epochs=e, rate=r,
               seed=1 if phase == "seed" else 0, evals=1,
               warmup_epochs=recipe_rates.warmup_epochs_for(o, "auto", b, e))
          for phase, o, e, b, rates in _LBS for r in rates),
    compared=True)


# LARS at depth: ResNet-20 of width 16 (about 270k weights), SGD,
# LARSMixed and LAMBMixed at 128, 1,024 and 4,096; 4 rates 2x apart each
# around the recipe's (SGD: 0.2 x B/128 capped at 1.6; LARS/LAMB: the
# 128 rate x sqrt(B/128)), chosen on seed 100, the best measured on seeds
# 101-103 (a best at the sweep's edge first extends it, `then`).
# `DEPTH_EPOCHS` on a GPU (12: the 36-run sweep took 13 min of an H200,
# 12 processes side by side); the CPU's reduced plan (`DEPTH_REDUCED`) is
# 6 epochs, batches 1,024 and 4,096.
DEPTH_OPTIMIZERS = {"sgd": 0.2, "lars_mixed": 10 * R2, "lamb_mixed": 0.016 * R2}
DEPTH_BATCHES, DEPTH_EPOCHS = (128, 1024, 4096), 12
DEPTH_CHOOSE, DEPTH_MEASURE = (100,), (101, 102, 103)
DEPTH_EXTEND = 3


def depth_rates(optimizer, batch):
    small = DEPTH_OPTIMIZERS[optimizer]
    center = (min(small * batch / SMALL_BATCH, 1.6) if optimizer == "sgd"
              else small * math.sqrt(batch / SMALL_BATCH))
    return [center * f for f in (0.25, 0.5, 1.0, 2.0)]


def depth_next(optimizer, batch, swept):
    """(the sweep's best rate, the rate to run next on the choosing seed or
    None): while the best lies at the sweep's edge, 2x beyond it, at most
    `DEPTH_EXTEND` rates beyond the grid; None once the best is measured."""
    best, edge = sweep_best(swept)
    grid = depth_rates(optimizer, batch)
    if edge == "lower" and best > grid[0] / 2 ** DEPTH_EXTEND:
        return best, best / 2
    if edge == "upper" and best < grid[-1] * 2 ** DEPTH_EXTEND:
        return best, best * 2
    return best, None


def depth_own(runs):
    """The runs of the depth plans among `runs`: ResNet-20 w16 with no
    variant, and no `for_kind` (the momentum plan, which writes the same
    record, tags each of its runs with the machine kind it was made for):
    the depth study chooses and measures on its own runs alone."""
    return [r for r in runs if r.get("workload") == "resnet20_w16"
            and not r.get("variant") and not r.get("for_kind")]


def _depth(epochs, batches, name):
    def arm(o, b, r, seeds):
        return fixed(b, r, seeds, epochs=epochs, optimizer=o,
                     workload="resnet20_w16")

    def then(runs):
        """Each (optimizer, batch)'s best rate on the choosing seed (fewest
        updates to 0.90, then final accuracy), with the measuring seeds,
        once its sweep is done; while the best lies at the sweep's edge, one
        more rate 2x beyond it first (at most `DEPTH_EXTEND` a side). The
        chain of extensions is replayed from the grid, so the ones already
        run are given again (a record's runs all come from its plan). The
        sweeps' extensions come before every measuring run: they decide
        what is measured."""
        extend, measure = [], []
        for o in DEPTH_OPTIMIZERS:
            for b in batches:
                mine = [r for r in depth_own(runs)
                        if r["optimizer"] == o and r["batch"] == b
                        and r["epochs"] == epochs
                        and r["seed"] in DEPTH_CHOOSE]
                grid = {round(r, 9) for r in depth_rates(o, b)}
                swept = [r for r in mine if round(r["rate"], 9) in grid]
                if len(swept) < 4:
                    continue
                while True:
                    best, beyond = depth_next(o, b, swept)
                    if beyond is None:
                        measure += arm(o, b, best, DEPTH_MEASURE)
                        break
                    extend += arm(o, b, beyond, DEPTH_CHOOSE)
                    ran = [r for r in mine
                           if round(r["rate"], 9) == round(beyond, 9)]
                    if not ran:
                        break
                    swept += ran
        return extend + measure

    return Plan(name, "lars_depth_study",
                f"SGD, LARSMixed, LAMBMixed on ResNet-20 w16, {epochs} epochs",
                tuple(s for b in batches for o in DEPTH_OPTIMIZERS
                      for r in depth_rates(o, b)
                      for s in arm(o, b, r, DEPTH_CHOOSE)), then,
                compared=True)


DEPTH = _depth(DEPTH_EPOCHS, DEPTH_BATCHES, "depth")
DEPTH_REDUCED = _depth(6, (1024, 4096), "depth_reduced")

# Momentum tuned as LARS was (issue 60): ResNet-20 w16 at 4,096, 12 epochs.
# SGD with Nesterov momentum 0.9 at LARSMixed's warmup (5/42 of the run,
# 1.43 epochs) and at 2.9 epochs, rates 0.1-1.6 on seed 100; the best of
# the ten (fewest updates to 0.90, then final accuracy), chosen within
# one machine kind (`provenance.machine_kind`), for every kind with runs
# (each waiting run names its kind, `for_kind`; a runner starts its own
# kind's, `Plan.specs_here`), and while it lies at the sweep's lowest or
# highest rate, 2x beyond it first (at most `DEPTH_EXTEND`); then the best
# on seeds 101-105. LARSMixed and LAMBMixed likewise: each one's best on
# seed 100 within the kind (`layerwise_best`; LARSMixed ran 2.5, 5, 10 on
# the CPU kind, LAMBMixed 0.016 there, and here 0.032 and 0.064 on
# TensorFlow, keyed apart from the H200 / JAX runs of those rates), then
# measured on seeds 101-105, so every arm has n = 5. A sweep's extensions
# are replayed from the runs no extension made (`_replay`), so each stays a
# run of the plan once the best it found is interior.
# The warmup bracketed (issue 74), fixed before it ran: once the grid's best
# is bracketed along the rate, while the best lies at the longest warmup
# run, the next warmup of `MOMENTUM_LONGER` at the best rate and its two
# neighbours (x 1/2, x 2) on seed 100, that row's best extended along the
# rate as the grid's is; 5.8 is 2 x 2.9, and 9 (not 11.6) leaves a quarter
# of the 12-epoch run to decay: a best at 9 is measured as it is, its
# warmup bounded below only. The bracketed best is measured on seeds
# 101-105 (the grid's best too, issue 60's arm), and SGD with plain
# momentum (no Nesterov) at its warmup and rate on the same seeds.
MOMENTUM_BATCH, MOMENTUM_RATES = 4096, (0.1, 0.2, 0.4, 0.8, 1.6)
MOMENTUM_WARMUPS = (recipe_rates.warmup_epochs_for(
    "lars_mixed", "auto", MOMENTUM_BATCH, DEPTH_EPOCHS), 2.9)
MOMENTUM_LONGER = (5.8, 9.0)
MOMENTUM_MEASURE = (101, 102, 103, 104, 105)
LAYERWISE = ("lars_mixed", "lamb_mixed")


def nesterov(rate, warmup, seeds, on=True):
    """SGD with Nesterov momentum on ResNet-20 w16 at 4,096, its variant
    named by its warmup ('nesterov_w1.43'); `on` False: plain momentum
    ('momentum_w2.9', `--nesterov=false`)."""
    name = "nesterov" if on else "momentum"
    return [dict(s, variant=f"{name}_w{warmup:.3g}",
                 flags=dict(nesterov="true" if on else "false"))
            for s in fixed(MOMENTUM_BATCH, rate, seeds, epochs=DEPTH_EPOCHS,
                           workload="resnet20_w16", warmup_epochs=warmup)]


def _kind_best(by, low, high):
    """(best, beyond) of `by` ({(warmup, rate) rounded: run}): the fewest
    updates to 0.90, then the higher final accuracy; beyond it 2x where it
    is its warmup's lowest or highest rate (within `DEPTH_EXTEND` doublings
    of `low` and `high`), else None."""
    def rank(key):
        to = stats.updates_to(points(by[key]), 0.90)
        return (math.inf if to is None else to, -by[key]["val_accuracy"])

    key = min(by, key=rank)
    best = (by[key]["warmup_epochs"], by[key]["rate"])
    warmup, rate = best
    rates = sorted(x for w, x in by if w == key[0])
    if key[1] == rates[0] and rate > low / 2 ** DEPTH_EXTEND:
        return best, (warmup, rate / 2)
    if key[1] == rates[-1] and rate < high * 2 ** DEPTH_EXTEND:
        return best, (warmup, rate * 2)
    return best, None


def momentum_key(warmup, rate):
    """A (warmup, rate) as the momentum sweeps key it (rounded)."""
    return round(warmup, 6), round(rate, 9)


def _replay(by, base):
    """(best, beyond, extensions) of a sweep: `by` ({(warmup, rate): run},
    every run on seed 100 of one kind) replayed from its `base` keys (the
    runs no extension made): while the best lies at an edge, the run 2x
    beyond it joins the sweep where it ran (`extensions`, (warmup, rate)
    in order), else it is `beyond`, the run to make next. The chain is
    given again from the base each time, so an extension stays a run of
    the plan once the best it found is interior."""
    swept = {k: by[k] for k in base}
    rates = [rate for _, rate in swept]
    extensions = []
    while True:
        best, beyond = _kind_best(swept, min(rates), max(rates))
        if beyond is None or momentum_key(*beyond) not in by:
            return best, beyond, extensions
        swept[momentum_key(*beyond)] = by[momentum_key(*beyond)]
        extensions.append(beyond)


def _on_kind(runs, kind, **where):
    return {momentum_key(r["warmup_epochs"], r["rate"]): r
            for r in runs if r.get("workload") == "resnet20_w16"
            and r["batch"] == MOMENTUM_BATCH and r["epochs"] == DEPTH_EPOCHS
            and r["seed"] in DEPTH_CHOOSE
            and provenance.machine_kind(r.get("machine")) == kind
            and all(r.get(k) == v for k, v in where.items())}


def momentum_swept(runs, kind, arm):
    """{(warmup, rate): run} of `arm` ('nesterov', or an optimizer of
    `LAYERWISE`) on seed 100 among the runs of machine kind `kind`: the
    runs that choose its rate there."""
    if arm != "nesterov":
        return _on_kind(runs, kind, optimizer=arm, variant=None)
    return {k: r for k, r in _on_kind(runs, kind, optimizer="sgd").items()
            if str(r.get("variant", "")).startswith("nesterov")}


def momentum_grid():
    """The Nesterov grid's (warmup, rate) keys: both warmups x the rates."""
    return {momentum_key(w, x) for w in MOMENTUM_WARMUPS
            for x in MOMENTUM_RATES}


def momentum_best(runs, kind):
    """((warmup, rate) of the Nesterov grid's best on seed 100 among the
    runs of machine kind `kind`, the (warmup, rate) to run next along the
    rate or None): None, None until every rate of the grid has run at both
    warmups. The grid's best alone: `momentum_chain` brackets its warmup."""
    by = momentum_swept(runs, kind, "nesterov")
    if not momentum_grid() <= by.keys():
        return None, None
    return _replay(by, momentum_grid())[:2]


class Chain(typing.NamedTuple):
    """The Nesterov sweep of one machine kind on seed 100 (`momentum_chain`):
    `grid_best` (warmup, rate) once the grid is bracketed along the rate,
    else None; `best` so far (None before the grid has run); `next`, the
    (warmup, rate) points to run next ([] once bracketed); `ran`, the points
    beyond the grid run so far, in order (the plan gives them again)."""
    grid_best: tuple
    best: tuple
    next: list
    ran: list


def _longer(swept, best):
    """The next warmup row while `best` lies at the longest warmup of
    `swept` ({(warmup, rate): run}): `MOMENTUM_LONGER`'s next warmup at
    the best rate and its neighbours; [] where a longer warmup lost, or
    there is none."""
    longest = max(w for w, _ in swept)
    warmup, rate = best
    longer = [w for w in MOMENTUM_LONGER if w > longest + 1e-6]
    if round(warmup, 6) < longest or not longer:
        return []
    return [(longer[0], rate / 2), (longer[0], rate), (longer[0], rate * 2)]


def momentum_chain(runs, kind):
    """The `Chain` of the Nesterov sweep on machine kind `kind`: its grid
    (both warmups x `MOMENTUM_RATES`) replayed along the rate (`_replay`),
    then, bracketed there, its warmup (`_longer`): each longer row's best
    extended along the rate as the grid's is (`_kind_best`), until a
    shorter warmup wins or `MOMENTUM_LONGER` ends. Replayed from the grid
    each time, so every point beyond it stays a run of the plan."""
    by = momentum_swept(runs, kind, "nesterov")
    if not momentum_grid() <= by.keys():
        return Chain(None, None, [], [])
    first, beyond, ran = _replay(by, momentum_grid())
    if beyond is not None:
        return Chain(None, first, [beyond], ran)
    swept = {k: by[k]
             for k in momentum_grid() | {momentum_key(*p) for p in ran}}
    low, high = min(MOMENTUM_RATES), max(MOMENTUM_RATES)
    while True:
        best, beyond = _kind_best(swept, low, high)
        step = [beyond] if beyond else _longer(swept, best)
        left = [p for p in step if momentum_key(*p) not in by]
        ran = ran + [p for p in step if momentum_key(*p) in by]
        if not step or left:
            return Chain(first, best, left, ran)
        swept.update((momentum_key(*p), by[momentum_key(*p)]) for p in step)


def _extension(run, own):
    """Whether the momentum plan's `then` made `run` to extend a sweep: it
    names a kind (`for_kind`) and its key is not in `own`, the plan's own
    specs' keys."""
    return bool(run.get("for_kind")) and runspec.run_key(run) not in own


def layerwise_chain(runs, optimizer, kind):
    """`_replay` of `optimizer`'s runs on seed 100 of machine kind `kind`
    from those no extension made (the depth plan's and this plan's own);
    (None, None, []) before 3 such rates have run there."""
    by = momentum_swept(runs, kind, optimizer)
    own = {runspec.run_key(s) for s in MOMENTUM.specs}
    base = {k for k, r in by.items() if not _extension(r, own)}
    if len(base) < 3:
        return None, None, []
    return _replay(by, base)


def layerwise_best(runs, optimizer, kind):
    """(the best rate of `optimizer` on seed 100 among the runs of machine
    kind `kind`, the rate to run next or None): None, None before 3 rates
    have run there (extensions of its sweep apart)."""
    best, beyond, _ = layerwise_chain(runs, optimizer, kind)
    return (best and best[1]), (beyond and beyond[1])


def _momentum_then(runs):
    """The runs that wait on others, for every machine kind that has run
    the workload at 4,096 and for this one, each tagged `for_kind` (the
    runner starts only its own kind's: `Plan.specs_here`); a function of
    `runs` alone beyond this machine's kind, so every recorded run is
    regenerated wherever the plan is read."""
    here = provenance.machine_kind(provenance.machine())
    kinds = {provenance.machine_kind(r.get("machine")) for r in runs
             if r.get("workload") == "resnet20_w16"
             and r.get("batch") == MOMENTUM_BATCH}
    return [dict(s, for_kind=kind) for kind in sorted(kinds | {here})
            for s in _momentum_then_on(runs, kind)]


def _momentum_sweep():
    return [s for rate in _SWEEP_ORDER for w in MOMENTUM_WARMUPS
            for s in nesterov(rate, w, DEPTH_CHOOSE)]


def _momentum_then_on(runs, kind):
    """The waiting runs of machine kind `kind`: the Nesterov sweep's chain
    beyond the grid (those run, then the next; `momentum_chain`), then
    its bracketed best and plain momentum there on the measuring seeds,
    the grid's best there too (issue 60's arm, measured once the grid is
    bracketed along the rate), and each layer-wise optimizer's; run on
    `kind`'s backend ('CPU VM / TensorFlow': tensorflow). On a kind other
    than `MOMENTUM_KIND`, whose sweep is the plan's own specs, the sweep
    too, and every run keyed by its backend, apart from the decisive
    kind's."""
    out = [] if kind == MOMENTUM_KIND else _momentum_sweep()
    chain = momentum_chain(runs, kind)
    for warmup, rate in chain.ran + chain.next:
        out += nesterov(rate, warmup, DEPTH_CHOOSE)
    if not chain.next and chain.best is not None:
        warmup, rate = chain.best
        out += nesterov(rate, warmup, MOMENTUM_MEASURE)
        out += nesterov(rate, warmup, MOMENTUM_MEASURE, on=False)
    if chain.grid_best is not None and (chain.next
                                        or chain.grid_best != chain.best):
        out += nesterov(chain.grid_best[1], chain.grid_best[0],
                        MOMENTUM_MEASURE)
    backend = kind.rsplit(" / ", 1)[-1].lower()
    for o in LAYERWISE:
        best, beyond, ran = layerwise_chain(runs, o, kind)
        same = dict(optimizer=o, epochs=DEPTH_EPOCHS, workload="resnet20_w16")
        for _, rate in ran + ([beyond] if beyond else []):
            out += [dict(s, run_backend=backend) for s in fixed(
                MOMENTUM_BATCH, rate, DEPTH_CHOOSE, **same)]
        if best is not None and beyond is None:
            out += fixed(MOMENTUM_BATCH, best[1], MOMENTUM_MEASURE, **same)
    if kind != MOMENTUM_KIND:
        out = [dict(s, run_backend=backend) for s in out]
    return out


_SWEEP_ORDER = (0.4, 0.8, 0.2, 1.6, 0.1)  # The likeliest bests first.
# The decisive machine kind (issue 60), whose sweep and LAMBMixed points
# are the plan's own specs; another kind (a GPU's) runs the whole
# comparison through `then`, keyed apart by its backend.
MOMENTUM_KIND = "CPU VM / TensorFlow"
MOMENTUM = Plan(
    "momentum", "lars_depth_study",
    "Nesterov SGD, its rate and warmup bracketed, against LARSMixed, "
    "LAMBMixed and plain momentum, ResNet-20 w16 at 4,096, n = 5 a side",
    tuple(dict(s, for_kind=MOMENTUM_KIND) for s in _momentum_sweep())
    + tuple(dict(s, run_backend="tensorflow", for_kind=MOMENTUM_KIND)
            for rate in (0.032, 0.064)
            for s in fixed(MOMENTUM_BATCH, rate, DEPTH_CHOOSE,
                           epochs=DEPTH_EPOCHS, optimizer="lamb_mixed",
                           workload="resnet20_w16")),
    _momentum_then, compared=True)

# The critical batch's branched probes (`bench/study/probes.py` analyses
# them): the trajectory, 128 at 0.2, seed 0, its checkpoints kept; from
# those after `EPOCHS_AT` epochs, one epoch at each batch at the rate the
# trajectory had there x B / 128, constant (`TRAJECTORY_RATE`, from its
# history), batch norm recomputed over `PRECISE_BN` batches before the one
# evaluation; the small batch also stopped after `SMALL_STEPS` updates.
EPOCHS_AT = (1, 3, 8)
PROBE_BATCHES = (128, 256, 512, 1024, 2048)
SMALL_SEEDS, LARGE_SEEDS = (1, 2), (1, 2)
SMALL_STEPS = (59, 117, 234, None)
PRECISE_BN, START_RATE = 16, 1e-12
TRAJECTORY_RATE = {1: 0.15008001029491425, 3: 0.1716729700565338,
                   8: 0.09969791769981384}
TRAJECTORY = dict(fixed(SMALL_BATCH, 0.2, [0])[0], variant="trajectory",
                  evals=1, flags=dict(keep_checkpoints=24))


def probe(epoch_at, batch, seed, steps=None, start=False):
    """One probe (`start`: the checkpoint itself, one update at
    `START_RATE`, evaluated as the probes are)."""
    rate = START_RATE if start else float(
        f"{TRAJECTORY_RATE[epoch_at] * batch / SMALL_BATCH:.6g}")
    k = max(1, batch // MICRO)
    trajectory = runspec.model_dir(TRAJECTORY, "{work_dir}")
    flags = dict(init_weights=os.path.join(
        trajectory, layout.CHECKPOINTS, layout.EPOCH.format(epoch_at)),
                 end_learning_rate=rate, keep_checkpoints=0,
                 precise_bn_batches=PRECISE_BN)
    if steps:
        flags["steps_per_epoch"] = steps
    if k >= 2:
        flags["gradient_noise_scale"] = "true"
    spec = dict(phase="probe", optimizer="sgd", batch=batch, rate=rate,
                seed=seed, epoch_at=epoch_at, steps=steps, epochs=1,
                warmup_epochs=0, evals=1, flags=flags)
    return dict(spec, start=True) if start else spec


def _probes(runs):
    """Once the trajectory has run: the small batch's points with each of
    its seeds, each larger batch's epoch with the first seed, each
    checkpoint's start, then the other seeds."""
    if not any(r.get("variant") == "trajectory" for r in runs):
        return
    for epoch in EPOCHS_AT:
        for seed in SMALL_SEEDS:
            for steps in SMALL_STEPS:
                yield probe(epoch, SMALL_BATCH, seed, steps)
        for batch in PROBE_BATCHES[1:]:
            yield probe(epoch, batch, LARGE_SEEDS[0])
    for epoch in EPOCHS_AT:
        yield probe(epoch, SMALL_BATCH, SMALL_SEEDS[0], 1, start=True)
    for seed in LARGE_SEEDS[1:]:
        for epoch in EPOCHS_AT:
            for batch in PROBE_BATCHES[1:]:
                yield probe(epoch, batch, seed)


PROBES = Plan("probes", "critical_batch_probe",
              "Branched probes of the critical batch beside B_simple",
              (TRAJECTORY,), _probes)

# A rehearsal of the runner and the report in seconds (the GPU check's
# `--smoke`, the tests): a fixed and a grown batch, 2 epochs of 4 steps.
_TINY = dict(micro=16, flags=dict(steps_per_epoch=4), evals=2)
SMOKE = Plan("smoke", "smoke_study", "A rehearsal: tiny runs, 2 epochs of 4 steps",
             tuple(fixed(32, 0.1, [0], epochs=2, **_TINY))
             + tuple(dict(s, batch=8, micro=16, evals=2,
                          flags=dict(steps_per_epoch=4))
                     for s in grown("default", 0.1, [0], epochs=2)))

# Which backend runs the study's network fastest on a machine: fixed 128
# and 1,024 for 2 epochs (the second's images/s: the first compiles) on
# each backend, two side by side as the study runs them.
BACKEND_SPEED = Plan("backend_speed", "backend_speed",
                     "Training images/s of the study's network per backend",
                     tuple(dict(s, evals=1, run_backend=k)
                           for k in ("tensorflow", "jax", "torch")
                           for b in (128, 1024)
                           for s in fixed(b, 0.2, [0, 1], epochs=2)))

# A kill costs at most the updates since the last checkpoint, and the rerun
# ends bit for bit where the uninterrupted run ends (`kills.py`): per setup
# of `kills.SETUPS`, `KILLS` runs killed at steps drawn from seed 0; on one
# process of each backend (`FAULT_SETUPS`), `KILLS` more whose newest
# checkpoint file is then truncated or deleted (`fault="damage"`): the rerun
# falls back to the newest checkpoint that loads whole.
KILLS = 10
FAULT_SETUPS = ("jax", "torch", "tensorflow")
KILL_RUNS = Plan("kills", "kill_campaign",
                 "Kills of the command at random steps, resumed bit for bit; "
                 "with a damaged newest checkpoint, resumed from the one "
                 "before",
                 tuple(dict(kind="kill", setup=name, kill=index, seed=0,
                            run_backend=backend, program="kills.py")
                       for name, (backend, *_) in kills.SETUPS.items()
                       for index in range(KILLS))
                 + tuple(dict(kind="kill", setup=name, kill=index, seed=0,
                              fault="damage",
                              run_backend=kills.SETUPS[name][0],
                              program="kills.py")
                         for name in FAULT_SETUPS for index in range(KILLS)))

PLANS = {p.name: p for p in (SCALING, DECISIVE, BASELINES, RAMPS, LARS_VS_SGD,
                             DEPTH, DEPTH_REDUCED, MOMENTUM, PROBES, SMOKE,
                             BACKEND_SPEED, KILL_RUNS)}

