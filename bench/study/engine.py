"""The one engine of the study's plans: `plans.TABLE` made `Plan`s
(`PLANS`), the builders of their specs, and the rules of the runs that wait
on others (`then`): a sweep's best rate, chosen on the choosing seeds,
extended 2x beyond a best at the sweep's edge, measured on other seeds.

A sweep's best (`rank`): the fewest median updates to 0.90, then the
highest mean final accuracy. A best at the sweep's lowest or highest rate
extends it by the run 2x beyond (`beyond`), at most `DEPTH_EXTEND`
doublings past the grid. The chain of extensions is replayed from the runs
no extension made each time it is read (`replay`), so an extension stays a
run of its plan once the best it found is interior.
"""

import math
import typing

from bench.core import provenance
from bench.core import runspec
from bench.core.plan import Plan
from bench.study import kills
from bench.study import plans
from bench.study import stats
from keras_largebatch.train.recipe import rates as recipe_rates


def points(r):
    """A run's [(updates, accuracy), ...]: its evaluations within epochs,
    else one at the end of each epoch."""
    if r.get("evals"):
        return [(u, a) for _, u, a in r["evals"]]
    per = r["num_train"] // r["batch"] if "num_train" in r else None
    return [((i + 1) * per, a) for i, a in enumerate(
        r.get("val_accuracy_per_epoch", []))] if per else []


def rank(group, target=0.90):
    """How a sweep orders its points (runs of one rate, the choosing
    seeds): (median updates to `target`, never as +infinity, minus the
    mean final accuracy); the lowest is the best."""
    to = stats.median([stats.updates_to(points(r), target) for r in group])
    return (to, -sum(r["val_accuracy"] for r in group) / len(group))


def beyond(rate, lowest, highest, low, high):
    """The rate 2x beyond a best `rate` that is its sweep's `lowest` or
    `highest`, within `DEPTH_EXTEND` doublings of the grid's `low` and
    `high`; else None."""
    if lowest and rate > low / 2 ** plans.DEPTH_EXTEND:
        return rate / 2
    if highest and rate < high * 2 ** plans.DEPTH_EXTEND:
        return rate * 2
    return None


def best_rate(runs, target):
    """The rate of `runs` (one batch and optimizer, the choosing seeds) of
    the best `rank`."""
    by_rate = {}
    for r in runs:
        by_rate.setdefault(round(r["rate"], 9), []).append(r)
    return min(by_rate, key=lambda rate: rank(by_rate[rate], target))


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


def grid(grid, **kw):
    """`fixed` over a {batch: {rate: seeds 0..n-1}} grid."""
    return [s for b, rates in grid.items() for r, n in rates.items()
            for s in fixed(b, r, range(n), **kw)]


def grown(variant, rate, seeds, epochs=24, optimizer="sgd"):
    """The batch grown from 128 at `rate` by `plans.GROWN[variant]`."""
    flags, start = plans.GROWN[variant]
    flags = dict(flags)
    if start != 1:
        linear = flags.get("adaptive_learning_rate") == "linear"
        flags.update(global_batch_size=plans.SMALL_BATCH * start,
                     base_learning_rate=f"{rate * start ** (1 if linear else 0.5):g}",
                     gradient_accumulation_steps=2 * start)
    warmup = recipe_rates.warmup_epochs_for(optimizer, "auto",
                                            plans.SMALL_BATCH, epochs)
    return [dict(kind="grown", phase="grown", optimizer=optimizer,
                 batch=plans.SMALL_BATCH, rate=rate, seed=seed, epochs=epochs,
                 warmup_epochs=warmup, variant=variant, flags=flags)
            for seed in seeds]


def ramp(schedule, rate, seeds, epochs=24, optimizer="sgd", variant=None):
    """The grown batch's start and rate rule without its measurements:
    `--adaptive_batch=schedule` from 128 at `rate` (2 micro-batches of 64)
    along `schedule`, the rate linear in the batch (the defaults' rule for
    SGD), the recipe's warmup of the small batch as the grown runs have;
    `variant` names a ramp other than `plans.RAMP_SCHEDULE`."""
    warmup = recipe_rates.warmup_epochs_for(optimizer, "auto",
                                            plans.SMALL_BATCH, epochs)
    flags = dict(adaptive_batch="schedule", batch_schedule=schedule,
                 adaptive_learning_rate="linear",
                 gradient_accumulation_steps=2)
    extra = {"variant": variant} if variant else {}
    return [dict(kind="ramp", phase="ramp", optimizer=optimizer,
                 batch=plans.SMALL_BATCH, rate=rate, seed=seed, epochs=epochs,
                 warmup_epochs=warmup, flags=flags, **extra)
            for seed in seeds]


def schedule_of(batch_per_epoch):
    """`--batch_schedule` of a run's batch per epoch: 'EPOCH:BATCH,...' at
    the first epoch and at each change."""
    steps = [(e, b) for e, b in enumerate(batch_per_epoch)
             if e == 0 or b != batch_per_epoch[e - 1]]
    return ",".join(f"{e}:{b}" for e, b in steps)


def batch_steps(schedule):
    """[(epoch, batch), ...] of a `--batch_schedule` text."""
    return [tuple(map(int, step.split(":"))) for step in schedule.split(",")]


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


def lbs(rows):
    """The LARS-against-SGD study's runs: (phase, optimizer, epochs, batch,
    rates) rows, seed 0 (the `seed` phase: 1), one evaluation an epoch."""
    return [dict(phase=phase, optimizer=o, batch=b, epochs=e, rate=r,
                 seed=1 if phase == "seed" else 0, evals=1,
                 warmup_epochs=recipe_rates.warmup_epochs_for(o, "auto", b, e))
            for phase, o, e, b, rates in rows for r in rates]


def kill_runs(count, setups=None, fault=None):
    """`count` kills of each setup of `kills.SETUPS` (or `setups`), run by
    the program `kills.py` (`fault`: what it does to the newest
    checkpoint)."""
    extra = {"fault": fault} if fault else {}
    return [dict(kind="kill", setup=name, kill=index, seed=0, **extra,
                 run_backend=kills.SETUPS[name][0], program="kills.py")
            for name in (setups or kills.SETUPS) for index in range(count)]


# LARS at depth (`plans.DEPTH_*`).
def depth_rates(optimizer, batch):
    small = plans.DEPTH_OPTIMIZERS[optimizer]
    center = (min(small * batch / plans.SMALL_BATCH, 1.6) if optimizer == "sgd"
              else small * math.sqrt(batch / plans.SMALL_BATCH))
    return [center * f for f in (0.25, 0.5, 1.0, 2.0)]


def depth_arm(o, b, r, seeds, epochs):
    return fixed(b, r, seeds, epochs=epochs, optimizer=o,
                 workload="resnet20_w16")


def depth_grid(epochs, batches):
    """Each optimizer's `depth_rates` at each batch on the choosing seed."""
    return [s for b in batches for o in plans.DEPTH_OPTIMIZERS
            for r in depth_rates(o, b)
            for s in depth_arm(o, b, r, plans.DEPTH_CHOOSE, epochs)]


def depth_next(optimizer, batch, swept):
    """(the sweep's best rate, the rate to run next on the choosing seed or
    None): `beyond` a best at the sweep's edge; None once the best is
    measured."""
    best, edge = sweep_best(swept)
    grid = depth_rates(optimizer, batch)
    return best, beyond(best, edge == "lower", edge == "upper", grid[0],
                        grid[-1])


def depth_own(runs):
    """The runs of the depth plans among `runs`: ResNet-20 w16 with no
    variant, and no `for_kind` (the momentum plan, which writes the same
    record, tags each of its runs with the machine kind it was made for):
    the depth study chooses and measures on its own runs alone."""
    return [r for r in runs if r.get("workload") == "resnet20_w16"
            and not r.get("variant") and not r.get("for_kind")]


def depth_then(epochs, batches):
    def then(runs):
        """Each (optimizer, batch)'s best rate on the choosing seed, with
        the measuring seeds, once its sweep is done; while the best lies
        at the sweep's edge, one more rate 2x beyond it first. The chain of
        extensions is replayed from the grid, so the ones already run are
        given again (a record's runs all come from its plan). The sweeps'
        extensions come before every measuring run: they decide what is
        measured."""
        extend, measure = [], []
        for o in plans.DEPTH_OPTIMIZERS:
            for b in batches:
                mine = [r for r in depth_own(runs)
                        if r["optimizer"] == o and r["batch"] == b
                        and r["epochs"] == epochs
                        and r["seed"] in plans.DEPTH_CHOOSE]
                grid = {round(r, 9) for r in depth_rates(o, b)}
                swept = [r for r in mine if round(r["rate"], 9) in grid]
                if len(swept) < 4:
                    continue
                while True:
                    best, next_rate = depth_next(o, b, swept)
                    if next_rate is None:
                        measure += depth_arm(o, b, best, plans.DEPTH_MEASURE,
                                             epochs)
                        break
                    extend += depth_arm(o, b, next_rate, plans.DEPTH_CHOOSE,
                                        epochs)
                    ran = [r for r in mine
                           if round(r["rate"], 9) == round(next_rate, 9)]
                    if not ran:
                        break
                    swept += ran
        return extend + measure

    return then


# Momentum tuned as LARS was (`plans.MOMENTUM_*`).
def nesterov(rate, warmup, seeds, on=True):
    """SGD with Nesterov momentum on ResNet-20 w16 at 4,096, its variant
    named by its warmup ('nesterov_w1.43'); `on` False: plain momentum
    ('momentum_w2.9', `--nesterov=false`)."""
    name = "nesterov" if on else "momentum"
    return [dict(s, variant=f"{name}_w{warmup:.3g}",
                 flags=dict(nesterov="true" if on else "false"))
            for s in fixed(plans.MOMENTUM_BATCH, rate, seeds,
                           epochs=plans.DEPTH_EPOCHS, workload="resnet20_w16",
                           warmup_epochs=warmup)]


def nesterov_sweep():
    """The Nesterov grid on the choosing seed, the likeliest bests first."""
    return [s for rate in plans.SWEEP_ORDER for w in plans.MOMENTUM_WARMUPS
            for s in nesterov(rate, w, plans.DEPTH_CHOOSE)]


def momentum_key(warmup, rate):
    """A (warmup, rate) as the momentum sweeps key it (rounded)."""
    return round(warmup, 6), round(rate, 9)


def kind_best(by, low, high):
    """(best, beyond) of `by` ({(warmup, rate) rounded: run}): the best
    `rank`; beyond it (`beyond`) where it is its warmup's lowest or highest
    rate, else None."""
    key = min(by, key=lambda k: rank([by[k]]))
    warmup, rate = best = (by[key]["warmup_epochs"], by[key]["rate"])
    rates = sorted(x for w, x in by if w == key[0])
    rate = beyond(rate, key[1] == rates[0], key[1] == rates[-1], low, high)
    return best, None if rate is None else (warmup, rate)


def replay(by, base):
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
        best, next_point = kind_best(swept, min(rates), max(rates))
        if next_point is None or momentum_key(*next_point) not in by:
            return best, next_point, extensions
        swept[momentum_key(*next_point)] = by[momentum_key(*next_point)]
        extensions.append(next_point)


def _on_kind(runs, kind, **where):
    return {momentum_key(r["warmup_epochs"], r["rate"]): r
            for r in runs if r.get("workload") == "resnet20_w16"
            and r["batch"] == plans.MOMENTUM_BATCH
            and r["epochs"] == plans.DEPTH_EPOCHS
            and r["seed"] in plans.DEPTH_CHOOSE
            and provenance.machine_kind(r.get("machine")) == kind
            and all(r.get(k) == v for k, v in where.items())}


def momentum_swept(runs, kind, arm):
    """{(warmup, rate): run} of `arm` ('nesterov', or an optimizer of
    `plans.LAYERWISE`) on seed 100 among the runs of machine kind `kind`:
    the runs that choose its rate there."""
    if arm != "nesterov":
        return _on_kind(runs, kind, optimizer=arm, variant=None)
    return {k: r for k, r in _on_kind(runs, kind, optimizer="sgd").items()
            if str(r.get("variant", "")).startswith("nesterov")}


def momentum_grid():
    """The Nesterov grid's (warmup, rate) keys: both warmups x the rates."""
    return {momentum_key(w, x) for w in plans.MOMENTUM_WARMUPS
            for x in plans.MOMENTUM_RATES}


def momentum_best(runs, kind):
    """((warmup, rate) of the Nesterov grid's best on seed 100 among the
    runs of machine kind `kind`, the (warmup, rate) to run next along the
    rate or None): None, None until every rate of the grid has run at both
    warmups. The grid's best alone: `momentum_chain` brackets its warmup."""
    by = momentum_swept(runs, kind, "nesterov")
    if not momentum_grid() <= by.keys():
        return None, None
    return replay(by, momentum_grid())[:2]


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
    longer = [w for w in plans.MOMENTUM_LONGER if w > longest + 1e-6]
    if round(warmup, 6) < longest or not longer:
        return []
    return [(longer[0], rate / 2), (longer[0], rate), (longer[0], rate * 2)]


def momentum_chain(runs, kind):
    """The `Chain` of the Nesterov sweep on machine kind `kind`: its grid
    (both warmups x `MOMENTUM_RATES`) replayed along the rate (`replay`),
    then, bracketed there, its warmup (`_longer`): each longer row's best
    extended along the rate as the grid's is (`kind_best`), until a
    shorter warmup wins or `MOMENTUM_LONGER` ends. Replayed from the grid
    each time, so every point beyond it stays a run of the plan."""
    by = momentum_swept(runs, kind, "nesterov")
    if not momentum_grid() <= by.keys():
        return Chain(None, None, [], [])
    first, next_point, ran = replay(by, momentum_grid())
    if next_point is not None:
        return Chain(None, first, [next_point], ran)
    swept = {k: by[k]
             for k in momentum_grid() | {momentum_key(*p) for p in ran}}
    low, high = min(plans.MOMENTUM_RATES), max(plans.MOMENTUM_RATES)
    while True:
        best, next_point = kind_best(swept, low, high)
        step = [next_point] if next_point else _longer(swept, best)
        left = [p for p in step if momentum_key(*p) not in by]
        ran = ran + [p for p in step if momentum_key(*p) in by]
        if not step or left:
            return Chain(first, best, left, ran)
        swept.update((momentum_key(*p), by[momentum_key(*p)]) for p in step)


def layerwise_chain(runs, optimizer, kind):
    """`replay` of `optimizer`'s runs on seed 100 of machine kind `kind`
    from those no extension made (the depth plan's and the momentum plan's
    own: an extension names a kind, `for_kind`, and is not among the
    plan's own specs); (None, None, []) before 3 such rates have run
    there."""
    by = momentum_swept(runs, kind, optimizer)
    own = {runspec.run_key(s) for s in PLANS["momentum"].specs}
    base = {k for k, r in by.items()
            if not r.get("for_kind") or runspec.run_key(r) in own}
    if len(base) < 3:
        return None, None, []
    return replay(by, base)


def layerwise_best(runs, optimizer, kind):
    """(the best rate of `optimizer` on seed 100 among the runs of machine
    kind `kind`, the rate to run next or None): None, None before 3 rates
    have run there (extensions of its sweep apart)."""
    best, next_point, _ = layerwise_chain(runs, optimizer, kind)
    return (best and best[1]), (next_point and next_point[1])


def momentum_then():
    def then(runs):
        """The runs that wait on others, for every machine kind that has
        run the workload at 4,096 and for this one, each tagged `for_kind`
        (the runner starts only its own kind's: `Plan.specs_here`); a
        function of `runs` alone beyond this machine's kind, so every
        recorded run is regenerated wherever the plan is read."""
        here = provenance.machine_kind(provenance.machine())
        kinds = {provenance.machine_kind(r.get("machine")) for r in runs
                 if r.get("workload") == "resnet20_w16"
                 and r.get("batch") == plans.MOMENTUM_BATCH}
        return [dict(s, for_kind=kind) for kind in sorted(kinds | {here})
                for s in _momentum_then_on(runs, kind)]

    return then


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
    out = [] if kind == plans.MOMENTUM_KIND else nesterov_sweep()
    chain = momentum_chain(runs, kind)
    for warmup, rate in chain.ran + chain.next:
        out += nesterov(rate, warmup, plans.DEPTH_CHOOSE)
    if not chain.next and chain.best is not None:
        warmup, rate = chain.best
        out += nesterov(rate, warmup, plans.MOMENTUM_MEASURE)
        out += nesterov(rate, warmup, plans.MOMENTUM_MEASURE, on=False)
    if chain.grid_best is not None and (chain.next
                                        or chain.grid_best != chain.best):
        out += nesterov(chain.grid_best[1], chain.grid_best[0],
                        plans.MOMENTUM_MEASURE)
    backend = kind.rsplit(" / ", 1)[-1].lower()
    for o in plans.LAYERWISE:
        best, next_point, ran = layerwise_chain(runs, o, kind)
        same = dict(optimizer=o, epochs=plans.DEPTH_EPOCHS,
                    workload="resnet20_w16")
        for _, rate in ran + ([next_point] if next_point else []):
            out += [dict(s, run_backend=backend) for s in fixed(
                plans.MOMENTUM_BATCH, rate, plans.DEPTH_CHOOSE, **same)]
        if best is not None and next_point is None:
            out += fixed(plans.MOMENTUM_BATCH, best[1],
                         plans.MOMENTUM_MEASURE, **same)
    if kind != plans.MOMENTUM_KIND:
        out = [dict(s, run_backend=backend) for s in out]
    return out


BUILDERS = dict(fixed=fixed, grown=grown, ramp=ramp, grid=grid, lbs=lbs,
                depth_grid=depth_grid, nesterov_sweep=nesterov_sweep,
                kills=kill_runs)
RULES = dict(depth=depth_then, momentum=momentum_then)


def arm_specs(arm, seeds=None):
    """The specs of one arm of a plan's entry (`seeds`: on these alone)."""
    kw = {k: v for k, v in arm.items() if k not in ("arm", "set")}
    if seeds is not None:
        kw["seeds"] = seeds
    return [dict(s, **arm.get("set", {})) for s in BUILDERS[arm["arm"]](**kw)]


def build(name, entry):
    """The `Plan` of one entry of `plans.TABLE`."""
    seeds = entry.get("by_seed")
    if seeds:
        specs = [s for seed in seeds for arm in entry["arms"]
                 if seed in arm.get("seeds", seeds)
                 for s in arm_specs(arm, [seed])]
    else:
        specs = [s for arm in entry["arms"] for s in arm_specs(arm)]
    rule, kw = entry.get("then", (None, {}))
    return Plan(name, entry["record"], entry["about"], tuple(specs),
                RULES[rule](**kw) if rule else None,
                entry.get("compared", False))


PLANS = {name: build(name, entry) for name, entry in plans.TABLE.items()}
