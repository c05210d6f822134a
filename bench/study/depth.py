"""LARS at depth (issue 50): LARSMixed, LAMBMixed and SGD on ResNet-20 w16.

Per budget, each optimizer's sweep on the choosing seed with its best rate
(`depth_best`); at each batch, each optimizer at that rate on the measuring
seeds of one machine kind (`depth_machine`), the pairs of `DEPTH_PAIRS`
compared, and the rate a user gets by default (`depth_findings`)."""

from bench.study import engine
from bench.study import plans
from bench.study import show
from bench.study import stats
from bench.study.selection import arm
from bench.study.selection import shortfall
from keras_largebatch.train.recipe import rates

# ResNet-20 w16 gets further: LARS at depth is read at these.
DEPTH_TARGETS = (0.90, 0.92, 0.93)
# The network and batch the findings are read at, and the pairs compared
# there (a against b).
DEPTH_WORKLOAD, DEPTH_BATCH = "resnet20_w16", 4096
DEPTH_NAME = "ResNet-20 w16"
OPTIMIZER_NAMES = {"sgd": "SGD", "lars_mixed": "LARSMixed",
                   "lamb_mixed": "LAMBMixed"}
DEPTH_PAIRS = (("lars_mixed", "sgd"), ("lamb_mixed", "sgd"),
               ("lars_mixed", "lamb_mixed"))


def depth_best(runs, batch, epochs=plans.DEPTH_EPOCHS):
    """{optimizer: (best rate, the next rate of its sweep or None)} of each
    sweep of 4 rates or more on the choosing seed (`engine.depth_next`: the
    plan's own choice, from the choosing seed's runs of the depth plans
    (`engine.depth_own`) on every kind)."""
    out = {}
    for o in plans.DEPTH_OPTIMIZERS:
        swept = [r for r in engine.depth_own(runs)
                 if r["optimizer"] == o and r["batch"] == batch
                 and r["epochs"] == epochs and r["seed"] in plans.DEPTH_CHOOSE]
        if len(swept) >= 4:
            out[o] = engine.depth_next(o, batch, swept)
    return out


def _depth_arm(runs, o, rate, batch, epochs, seeds=plans.DEPTH_MEASURE):
    return arm(runs, OPTIMIZER_NAMES[o], DEPTH_TARGETS, workload=DEPTH_WORKLOAD,
               optimizer=o, batch=batch, epochs=epochs, rate=rate, seeds=seeds,
               variant=None)


def depth_machine(runs, best, batch, epochs=plans.DEPTH_EPOCHS):
    """(kind, why): the machine kind whose measuring runs at the best rates
    complete the most arms (then hold the most runs); None before any."""
    score = {}
    for k in sorted({r["kind_of_machine"] for r in runs}):
        here = [r for r in runs if r["kind_of_machine"] == k]
        n = [len(_depth_arm(here, o, rate, batch, epochs).seeds)
             for o, (rate, _) in best.items()]
        if sum(n):
            score[k] = (sum(x >= len(plans.DEPTH_MEASURE) for x in n), sum(n))
    if not score:
        return None, "no measuring run yet"
    kind = max(score, key=lambda k: score[k])
    others = [k for k in score if k != kind]
    return kind, (f"{kind}: {score[kind][0]} of {len(best)} arms complete"
                  + (f"; the measuring runs on {', '.join(others)} are not "
                     "pooled with it" if others else ""))


def depth_findings(runs, batch=DEPTH_BATCH, epochs=plans.DEPTH_EPOCHS):
    """LARS at depth at `batch`: each optimizer at its sweep's best rate on
    the measuring seeds of one machine kind (`depth_machine`), the pairs of
    `DEPTH_PAIRS` compared (`stats.compare`), and the rate a user gets by
    default (LARSMixed under `--lr_scaling=auto`: `mlperf_lars_rate`, its
    warmup) on the choosing seed and, where it is the best, measured (at
    `DEPTH_BATCH` only: the one batch whose sweep runs that rate; None
    elsewhere). Only the depth plans' runs count (`engine.depth_own`): the
    momentum plan's runs of the same network and batch are its own
    comparison's."""
    runs = engine.depth_own(runs)
    best = depth_best(runs, batch, epochs)
    kind, why = depth_machine(runs, best, batch, epochs)
    here = [r for r in runs if r["kind_of_machine"] == kind]
    arms, pairs = {}, []
    for o in plans.DEPTH_OPTIMIZERS:
        rate, beyond = best.get(o, (None, None))
        a = _depth_arm(here, o, rate if rate is not None else -1, batch, epochs)
        arms[o] = dict(rate=rate, extending_to=beyond, n=len(a.seeds),
                       seeds=list(a.seeds), arm=a)
    for o, p in DEPTH_PAIRS:
        n = (arms[o]["n"], arms[p]["n"])
        status = shortfall(*n)
        for q in (o, p):
            if arms[q]["rate"] is None:
                status = f"not run yet (n = 0): {OPTIMIZER_NAMES[q]}'s sweep " \
                         "has not run"
            elif arms[q]["extending_to"] is not None and not arms[q]["n"]:
                status = (f"not run yet (n = 0): {OPTIMIZER_NAMES[q]}'s "
                          f"best, {arms[q]['rate']:.4g}, lies at its sweep's "
                          f"edge; {arms[q]['extending_to']:.4g} runs first")
        pairs.append(dict(
            claim=f"{OPTIMIZER_NAMES[o]} against {OPTIMIZER_NAMES[p]}, "
                  f"{DEPTH_NAME} at {batch:,}", a=o, b=p, n=n, status=status,
            result=None if shortfall(*n) else stats.compare(
                arms[o]["arm"], arms[p]["arm"], DEPTH_TARGETS)))
    rate = rates.peak_learning_rate("lars_mixed", 0, batch)
    warmup = rates.warmup_epochs_for("lars_mixed", "auto", batch, epochs)
    chose = [r for r in runs if r.get("workload") == DEPTH_WORKLOAD
             and r["optimizer"] == "lars_mixed" and r["batch"] == batch
             and r["epochs"] == epochs and r["seed"] in plans.DEPTH_CHOOSE
             and round(r["rate"], 6) == round(rate, 6)
             and abs(r["warmup_epochs"] - warmup) < 1e-9]
    measured = round(arms["lars_mixed"]["rate"] or -1, 6) == round(rate, 6)
    if batch != DEPTH_BATCH:
        chose = None
    default = dict(rate=rate, warmup_epochs=warmup, choosing=[dict(
        seed=r["seed"], machine=r["kind_of_machine"],
        final=r["val_accuracy"], updates_to_090=stats.updates_to(
            engine.points(r), 0.90)) for r in chose],
        measured=arms["lars_mixed"]["n"] if measured else 0,
        is_best=measured) if chose is not None else None
    for a in arms.values():
        a.pop("arm")
    return dict(network=DEPTH_NAME, batch=batch, epochs=epochs, machine=kind,
                machine_why=why, arms=arms, pairs=pairs, default=default)


def _few(n):
    """Why the updates have no verdict with fewer than `stats.MIN_SEEDS`
    seeds an arm ('' otherwise)."""
    if min(n) >= stats.MIN_SEEDS:
        return ""
    return (f" (fewer than {stats.MIN_SEEDS} seeds an arm: a bootstrap "
            "interval of a median over so few seeds is about [min, max], "
            "too narrow to decide; reach is Fisher's)")


def depth_finding_lines(found):
    """The depth findings, each naming the network and batch: final
    accuracy (Welch), reach of 0.90 (Fisher), updates to 0.90 (bootstrap),
    verdicts; then the default's row."""
    seeds = "–".join(map(str, (plans.DEPTH_MEASURE[0], plans.DEPTH_MEASURE[-1])))
    lines = []
    where = found["machine_why"]
    for f in found["pairs"]:
        a, b = found["arms"][f["a"]], found["arms"][f["b"]]
        place = (f"{found['epochs']} epochs; seeds {seeds}; "
                 f"{found['machine'] or 'no machine yet'}; ")
        # A pair without a result has a status (`depth_findings`).
        if f["status"]:
            lines.append(show.finding(f["claim"], place, f["n"], f["status"]))
            continue
        lines.append(show.finding(
            f["claim"], place, f["n"], how=f"rates {a['rate']:.4g} and "
            f"{b['rate']:.4g}, each its sweep's best on seed "
            f"{plans.DEPTH_CHOOSE[0]}",
            said=show.pair(f["result"], f["n"]) + _few(f["n"])))
    if found["machine"]:
        lines.append(f"  - Machine kind: {where}.")
    d = found["default"]
    if d is None:
        return lines
    head = (f"- **The default: LARSMixed at {found['batch']:,} with "
            f"`--lr_scaling=auto`** (`mlperf_lars_rate({found['batch']})` = "
            f"{d['rate']:g}, warmup {d['warmup_epochs']:.2f} epochs: the "
            f"plan's run at that rate and warmup): ")
    if not d["choosing"]:
        lines.append(head + "not run yet (n = 0).")
        return lines
    seen = "; ".join(
        f"seed {c['seed']} ({c['machine']}): final accuracy {c['final']:.4f},"
        " 0.90 " + ("never" if c["updates_to_090"] is None else
                    f"after {show.number(c['updates_to_090'])} updates")
        for c in d["choosing"])
    lars = found["arms"]["lars_mixed"]
    if d["is_best"]:
        more = (f"it is LARSMixed's best: measured above (n = {d['measured']})"
                if d["measured"] else "it is LARSMixed's best; its measuring "
                "seeds have not run (n = 0)")
    elif lars["rate"] is not None:
        more = (f"LARSMixed's best on that seed is {lars['rate']:.4g}, which "
                "the measuring seeds run: n = 1 at the default, no interval")
    else:
        more = "n = 1, no interval"
    lines.append(head + seen + f"; {more}.")
    return lines


def depth_lines(runs):
    """LARS at depth (the plans `depth`, `depth_reduced`), per budget: each
    optimizer and batch's runs on the choosing seed with their machine kind
    (final accuracy and training loss, updates to `DEPTH_TARGETS`), the
    sweep's best marked (from the depth plans' runs of every kind, as the
    plan chooses; said when it lies at the grid's edge); then, per batch,
    the findings on the measuring seeds (`depth_findings`)."""
    deep = engine.depth_own(runs)
    lines = []
    for epochs in sorted({r["epochs"] for r in deep}):
        here = [r for r in deep if r["epochs"] == epochs]
        batches = sorted({r["batch"] for r in here})
        lines += ["", f"### {epochs} epochs: each rate on seed "
                  f"{', '.join(map(str, plans.DEPTH_CHOOSE))}", "",
                  "| machine | optimizer | batch | rate | warmup (epochs) | "
                  "final val acc | final train loss | " + " | ".join(
                      f"updates to {t}" for t in DEPTH_TARGETS) + " | |",
                  "|" + "---|" * (8 + len(DEPTH_TARGETS))]
        for b in batches:
            best = depth_best(here, b, epochs)
            for o in plans.DEPTH_OPTIMIZERS:
                swept = sorted((r for r in here if r["optimizer"] == o
                                and r["batch"] == b
                                and r["seed"] in plans.DEPTH_CHOOSE),
                               key=lambda r: r["rate"])
                rate, beyond = best.get(o, (None, None))
                for r in swept:
                    mark = ("best" + (f", at the edge: {beyond:.4g} next"
                                      if beyond else "")
                            if rate is not None
                            and round(r["rate"], 9) == round(rate, 9) else "")
                    lines.append(
                        f"| {r['kind_of_machine']} | {o} | {b:,} | "
                        f"{r['rate']:.4g} | {r['warmup_epochs']:.3g} | "
                        f"{r['val_accuracy']:.4f} | "
                        f"{r['train_loss_per_epoch'][-1]:.3f} | " + " | ".join(
                            show.number(stats.updates_to(engine.points(r), t))
                            for t in DEPTH_TARGETS) + f" | {mark} |")
        for b in batches:
            lines += ["", f"At {b:,}, each optimizer at its best rate on "
                      f"seeds {', '.join(map(str, plans.DEPTH_MEASURE))}:", ""]
            lines += depth_finding_lines(depth_findings(here, b, epochs))
    return lines
