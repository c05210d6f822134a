"""The page's tables of the compared runs: the front (each fixed batch's
best rate per target), the grown batch's trade-off, every configuration,
and what the runs of the measuring seeds cost."""

import statistics

from bench.study import engine
from bench.study import plans
from bench.study import show
from bench.study import stats
from bench.study.selection import TARGETS
from bench.study.selection import arm
from bench.study.selection import config


def front(runs, machine, target, epochs=24, optimizer="sgd", choose=range(10)):
    """{batch: (best rate, its summary on the choosing seeds)}: each fixed
    batch's best rate for `target` on one machine kind, chosen on the seeds
    of `choose` only (the seeds that measure it are others)."""
    out = {}
    pool = [r for r in runs if r.get("kind") == "fixed" and r["epochs"] == epochs
            and r["optimizer"] == optimizer and r["seed"] in choose
            and r["kind_of_machine"] == machine
            and r.get("workload", "resnet8_w4") == "resnet8_w4"]
    for batch in sorted({r["batch"] for r in pool}):
        group = [r for r in pool if r["batch"] == batch]
        rate = engine.best_rate(group, target)
        out[batch] = (rate, arm(group, f"fixed {batch}", rate=rate))
    return out


def front_lines(runs):
    lines = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        for t in TARGETS:
            best = front(runs, machine, t)
            if len(best) < 2:
                continue
            lines.append(f"- {machine}, {t}: " + "; ".join(
                f"{b:,} at {rate:g} → "
                f"{show.number(stats.median(a.updates_to[t]))} "
                f"(n={len(a.seeds)})" for b, (rate, a) in best.items()))
    return lines


def tradeoff_lines(runs):
    """The grown variants: c, start multiple, rule, cap -> final accuracy
    and updates to 0.90, with intervals, per machine kind."""
    lines = ["| machine | variant | rate | c | start | rule | cap | n | final "
             "val acc [95%] | updates to 0.90 [95%] (reached) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in runs:
        if r.get("kind") == "grown" and r["epochs"] == 24 \
                and r["optimizer"] == "sgd":
            groups.setdefault((r["kind_of_machine"], r["variant"],
                               round(r["rate"], 6)), []).append(r)
    for (machine, variant, rate), group in sorted(groups.items()):
        flags, start = plans.GROWN[variant]
        acc = stats.mean_interval([r["val_accuracy"] for r in group])
        to = [stats.updates_to(engine.points(r), 0.90) for r in group]
        lines.append(
            f"| {machine} | {variant} | {rate:g} | "
            f"{flags.get('noise_scale_multiple', 'default')} | "
            f"{start if flags else 'default'} | "
            f"{flags.get('adaptive_learning_rate', 'default')} | "
            f"{flags.get('max_global_batch_size', 'default')} | {len(group)} | "
            f"{show.interval(*acc, 4)} | "
            f"{show.interval(*stats.bootstrap_median(to))} "
            f"({sum(v is not None for v in to)}/{len(group)}) |")
    return lines


def config_table(runs):
    """Every configuration on every machine kind: n, seeds, final accuracy
    mean ± sd, and per target the seeds reaching it and the median updates
    with its bootstrap 95% interval."""
    groups = {}
    for r in runs:
        groups.setdefault((r["record"], r["kind_of_machine"]) + config(r),
                          []).append(r)
    head = ("| record | machine | workload | run | optimizer | epochs | batch "
            "| rate | variant | n | final val acc | "
            + " | ".join(f"to {t}" for t in TARGETS) + " |")
    lines = [head, "|" + "---|" * (10 + len(TARGETS) + 1)]
    for key in sorted(groups, key=str):
        group = sorted(groups[key], key=lambda r: r["seed"])
        finals = [r["val_accuracy"] for r in group]
        mean = sum(finals) / len(finals)
        sd = (sum((x - mean) ** 2 for x in finals) / (len(finals) - 1)) ** 0.5 \
            if len(finals) > 1 else None
        cells = []
        for t in TARGETS:
            values = [stats.updates_to(engine.points(r), t) for r in group]
            m, lo, hi = stats.bootstrap_median(values)
            reached = sum(v is not None for v in values)
            cells.append(f"{show.interval(m, lo, hi)} ({reached}/{len(group)})"
                         if len(group) > 1
                         else f"{show.number(m)} ({reached}/1)")
        lines.append("| " + " | ".join(str(x) for x in key) + f" | {len(group)} | "
                     + (f"{mean:.4f} ± {sd:.4f}" if sd is not None
                        else f"{mean:.4f} (one seed)") + " | "
                     + " | ".join(cells) + " |")
    return lines


def runtime_lines(runs, seeds=range(100, 200)):
    """What each configuration's runs on the measuring seeds (`seeds`) took,
    per machine kind, as the records give their wall times (two or more
    runs side by side on a machine, as the study runs them): n, minimum,
    median and maximum minutes. A run that resumed (its record's
    `epochs_timed` below its epochs, 0 included) times only its last
    invocation: left out, and counted below the table."""
    groups, resumed = {}, []
    for r in runs:
        if r["seed"] not in seeds or not r.get("wall_seconds"):
            continue
        # 0 epochs timed: recorded by a call that found the run's last
        # checkpoint and only evaluated it.
        timed = r.get("epochs_timed")
        if timed is not None and timed < r["epochs"]:
            resumed.append(r)
            continue
        groups.setdefault((r["kind_of_machine"],) + config(r), []).append(
            r["wall_seconds"] / 60)
    lines = ["| machine | network | kind | optimizer | epochs | batch | rate | "
             "variant | n | minutes: min / median / max |",
             "|" + "---|" * 10]
    for key in sorted(groups, key=str):
        kind, workload, what, o, epochs, batch, rate, variant = key
        m = groups[key]
        lines.append(f"| {kind} | {workload} | {what} | {o} | {epochs} | "
                     f"{batch:,} | {rate:g} | {variant or ''} | {len(m)} | "
                     f"{min(m):.1f} / {statistics.median(m):.1f} / "
                     f"{max(m):.1f} |")
    if resumed:
        lines += ["", f"Left out: {len(resumed)} run(s) that resumed after a "
                  "stop, whose records time only the last invocation."]
    return lines
