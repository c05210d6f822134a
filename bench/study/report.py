"""The study's report, computed from the records: `bench/results/study.md`
and `study.json` (the same numbers).

A configuration's runs are grouped per machine kind and pooled across kinds
only where `stats.same_machine_test` passes (`POOLS`). Each finding of
`COMPARISONS` names its two arms, the seeds each is measured on and those
its rate was chosen on; the verdict words come from the intervals. The
page opens with the defaults against each baseline (`BASELINE_ARMS`) and
LARS at depth (`depth_findings`); an arm without runs reads "not run yet".
"""

import json
import math
import os

import numpy as np

from bench.study import kills
from bench.study import plans
from bench.study import probes
from bench.study import runner
from bench.study import stats
from keras_largebatch.train import recipe

TARGETS = (0.88, 0.89, 0.90, 0.905)
# ResNet-20 w16 gets further: LARS at depth is read at these.
DEPTH_TARGETS = (0.90, 0.92, 0.93)
# Records of retired studies (no plan writes them), listed run by run with
# the `SHOWN` fields they have.
RETIRED = {
    "study_backends": "training images/s per backend (now `backend_speed`)",
    "adaptive_batch_study": "the grown batch's first study",
    "adaptive_batch_study_8": "its c = 8 runs",
    "adaptive_batch_seeds": "the previous defaults over seeds",
    "noise_scale_sweeps": "the noise-scale study's fit-phase sweeps",
    "large_batch_study_digits": "the study on scikit-learn's digits"}
SHOWN = ("policy", "phase", "kind", "optimizer", "batch", "global_batch_size",
         "start_batch", "max_batch", "epochs", "rate", "peak_learning_rate",
         "lr_rule", "c", "seed", "updates", "val_accuracy", "backend",
         "fixed 128", "fixed 1,024")
CPU = "CPU VM / JAX"


def load_all(results=runner.RESULTS):
    """Every run of the records of the plans compared (`Plan.compared`),
    each with its record's name and its machine kind."""
    runs = []
    for name in dict.fromkeys(p.record for p in plans.PLANS.values()
                              if p.compared):
        for r in runner.load(os.path.join(results, name + ".json")):
            runs.append(dict(r, record=name, kind_of_machine=runner.machine_kind(
                r.get("machine", "CPU VM (JAX)"))))
    return runs


def config(r):
    return (r.get("workload", "resnet8_w4"), r.get("kind") or r.get("phase"),
            r["optimizer"], r["epochs"], r["batch"], round(r["rate"], 6),
            r.get("variant"))


def arm(runs, name, targets=TARGETS, **where):
    """The `stats.Arm` of the runs matching `where` (a field's value; `seeds`
    a collection; `rate` to 6 digits), with their updates to `targets`."""
    seeds = where.pop("seeds", None)
    chosen = [r for r in runs if (seeds is None or r["seed"] in seeds)
              and all(round(r.get(k), 6) == round(v, 6) if k == "rate"
                      else r.get(k) == v for k, v in where.items())]
    chosen.sort(key=lambda r: r["seed"])
    machines = {r["kind_of_machine"] for r in chosen}
    return stats.Arm(
        name=name, machine=" + ".join(sorted(machines)) or "none",
        seeds=tuple(r["seed"] for r in chosen),
        final=tuple(r["val_accuracy"] for r in chosen),
        updates_to={t: tuple(stats.updates_to(plans.points(r), t) for r in chosen)
                    for t in targets})


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
        rate = plans.best_rate(group, target)
        out[batch] = (rate, arm(group, f"fixed {batch}", rate=rate))
    return out


# The findings: (claim, arm a's selection, arm b's selection, where the
# rates were chosen). Arms hold the seeds their plan fixed before running.
D = plans.DECISIVE_SEEDS
COMPARISONS = (
    ("The command's defaults (grown from 128 at 0.4) against fixed 1,024 at "
     "0.8 (the H200 / JAX front's best for 0.90, one seed a rate)",
     dict(kind="grown", variant="default", rate=0.4, epochs=24, seeds=D),
     dict(kind="fixed", batch=1024, rate=0.8, epochs=24, optimizer="sgd",
          seeds=D),
     "0.4: fixed 128's best of 0.1/0.2/0.4, seeds 0-2; 0.8: 1,024's best of "
     "0.4-3.2 on seed 0 (H200 / JAX, one seed a rate), run again on seeds "
     "1-4", range(5)),
    ("LARSMixed at 1,024 (20) against SGD at 1,024 (0.8)",
     dict(kind="fixed", optimizer="lars_mixed", batch=1024, rate=20.0,
          epochs=24),
     dict(kind="fixed", optimizer="sgd", batch=1024, rate=0.8, epochs=24,
          seeds=range(10)),
     "seed 0 for both, which LARSMixed's arm also measures (biased its way)",
     (0,)),
    ("LAMBMixed at 4,096 (0.128) against SGD at 4,096 (0.8), 8 epochs",
     dict(optimizer="lamb_mixed", batch=4096, rate=0.128, epochs=8),
     dict(optimizer="sgd", batch=4096, rate=0.8, epochs=8),
     "seed 0 for both, which both arms also measure", (0,)),
    ("LARSMixed at 4,096 (10) against SGD at 4,096 (0.8), 8 epochs",
     dict(optimizer="lars_mixed", batch=4096, rate=10.0, epochs=8),
     dict(optimizer="sgd", batch=4096, rate=0.8, epochs=8),
     "seed 0 for both, which both arms also measure", (0,)),
)
# The goal's floor for the defaults' final accuracy. It is not the small
# batch's measured accuracy (fixed 128 at 0.4: `SMALL`, shown beside it).
FLOOR = 0.907
SMALL = dict(kind="fixed", batch=128, rate=0.4, epochs=24, optimizer="sgd")
# Configurations run on two machine kinds: (name, a's selection on one,
# b's on the other). Pooled only where `stats.same_machine_test` passes.
POOLS = (
    ("grown defaults at 0.2, seeds 0-2",
     dict(kind="grown", variant="start4_c4_linear_1024", rate=0.2, seeds=(0, 1, 2),
          kind_of_machine=CPU),
     dict(kind="grown", variant="default", rate=0.2, epochs=24, seeds=(0, 1, 2),
          kind_of_machine="H100 / JAX")),
    ("fixed 1,024 at 0.8, seeds 0-4",
     dict(kind="fixed", batch=1024, rate=0.8, epochs=24, optimizer="sgd",
          seeds=(0, 1, 2, 3, 4), kind_of_machine=CPU),
     dict(kind="fixed", batch=1024, rate=0.8, epochs=24, optimizer="sgd",
          seeds=(0, 1, 2, 3, 4), kind_of_machine="H200 / JAX")),
)

# The defaults against each baseline of issue 51 (the decisive fixed arm and
# `plans.BASELINES`): (name, selection, where its rate or schedule came
# from), on the decisive seeds and their machine kind only.
DEFAULTS = dict(kind="grown", variant="default", rate=0.4, epochs=24,
                optimizer="sgd")
BASELINE_MACHINE = "CPU VM / TensorFlow"
RAMP = "the fixed ramp ({}, 0.4 x the batch / 128)".format(", then ".join(
    f"{b:,} from epoch {e}" for e, b in (
        map(int, step.split(":")) for step in plans.RAMP_SCHEDULE.split(","))))
BASELINE_ARMS = (
    ("fixed 1,024 at 0.8", dict(kind="fixed", batch=1024, rate=0.8, epochs=24,
                                optimizer="sgd"),
     "the H200 / JAX front's best for 0.90; its rate chosen there on seed 0, "
     "one seed a rate"),
    (RAMP, dict(kind="ramp", rate=0.4, epochs=24, optimizer="sgd"),
     "the schedule the grown defaults at 0.4 followed on seeds 0-4 (CPU VM / "
     "JAX), written in the plan before it ran"),
    ("fixed 512 at 1.6", dict(kind="fixed", batch=512, rate=1.6, epochs=24,
                              optimizer="sgd"),
     "the CPU VM / JAX front's best for 0.90 and 0.905, seeds 0-2"),
    ("fixed 1,024 at 0.8 over 36 epochs", dict(
        kind="fixed", batch=1024, rate=0.8, epochs=36, optimizer="sgd"),
     "the decisive arm's rate; its decay ends after the grown runs'"),
)
# LARS at depth (issue 50): the network and batch its findings are read at,
# and the pairs compared there (a against b).
DEPTH_WORKLOAD, DEPTH_BATCH = "resnet20_w16", 4096
DEPTH_NAME = "ResNet-20 w16"
OPTIMIZER_NAMES = {"sgd": "SGD", "lars_mixed": "LARSMixed",
                   "lamb_mixed": "LAMBMixed"}
DEPTH_PAIRS = (("lars_mixed", "sgd"), ("lamb_mixed", "sgd"),
               ("lars_mixed", "lamb_mixed"))


def _fmt(x, digits=0):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return ("never" if not digits else "∞") if x > 0 else "−∞"
    return f"{x:,.{digits}f}"


def _interval(v, lo, hi, digits=0):
    return f"{_fmt(v, digits)} [{_fmt(lo, digits)}, {_fmt(hi, digits)}]"


def comparison(runs, claim, sel_a, sel_b, chosen, choosing=()):
    """One finding: both arms on each machine kind they share; the accuracy
    difference and, per target, the ratio of median updates, with their
    intervals and verdicts (`stats.compare`); where a seed that chose a
    rate (`choosing`) also measures it, no verdict decides."""
    out = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        here = [r for r in runs if r["kind_of_machine"] == machine]
        a, b = arm(here, "a", **dict(sel_a)), arm(here, "b", **dict(sel_b))
        if len(a.seeds) < 2 or len(b.seeds) < 2:
            continue
        result = stats.compare(a, b, TARGETS)
        try:
            stats.seeds_disjoint(choosing, a.seeds + b.seeds)
        except ValueError:
            undecided = "cannot tell (a measuring seed chose the rate)"
            result["accuracy"]["verdict"] = undecided
            for t in TARGETS:
                result["targets"][t]["verdict"] = undecided
        out.append(dict(claim=claim, machine=machine, chosen_on=chosen,
                        result=result))
    return out


def floor_line(runs):
    """The defaults' final accuracy on the decisive seeds against `FLOOR`,
    and the small batch's own (`SMALL`) on each kind it ran on."""
    lines = []
    small = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        s = arm([r for r in runs if r["kind_of_machine"] == machine], "s",
                **SMALL)
        if len(s.seeds) >= 2:
            small.append(f"{stats.mean_interval(s.final)[0]:.4f} ± "
                         f"{float(np.std(s.final, ddof=1)):.4f} (n = "
                         f"{len(s.seeds)}, seeds "
                         f"{', '.join(map(str, s.seeds))}, {machine})")
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        a = arm([r for r in runs if r["kind_of_machine"] == machine], "a",
                **dict(COMPARISONS[0][1]))
        if len(a.seeds) >= 2:
            mean, lo, hi = stats.mean_interval(a.final)
            lines.append(
                f"- **The defaults' final accuracy against the goal's floor "
                f"of {FLOOR}** ({machine}; n = {len(a.seeds)}): "
                f"{_interval(mean, lo, hi, 4)}: **"
                + stats.verdict(lo, hi, "higher", FLOOR).replace(
                    "ahead", "above").replace("behind", "below") + "**. The "
                "floor is not the small batch's accuracy: fixed 128 at 0.4 "
                "ended at " + ("; ".join(small) or "(not recorded)") + ".")
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
        to = [stats.updates_to(plans.points(r), 0.90) for r in group]
        lines.append(
            f"| {machine} | {variant} | {rate:g} | "
            f"{flags.get('noise_scale_multiple', 'default')} | "
            f"{start if flags else 'default'} | "
            f"{flags.get('adaptive_learning_rate', 'default')} | "
            f"{flags.get('max_global_batch_size', 'default')} | {len(group)} | "
            f"{_interval(*acc, 4)} | {_interval(*stats.bootstrap_median(to))} "
            f"({sum(v is not None for v in to)}/{len(group)}) |")
    return lines


def pools(runs):
    out = []
    for name, sel_a, sel_b in POOLS:
        a, b = arm(runs, "a", **dict(sel_a)), arm(runs, "b", **dict(sel_b))
        if len(a.seeds) >= 2 and len(b.seeds) >= 2:
            passes, diff, lo, hi = stats.same_machine_test(a, b)
            out.append(dict(name=name, machines=(a.machine, b.machine),
                            n=(len(a.seeds), len(b.seeds)), passes=passes,
                            diff=diff, low=lo, high=hi))
    return out


def finding_lines(found, brief=False, targets=TARGETS):
    """Each finding: the claim, machine, n per arm, the accuracy difference
    and, per target either arm reaches, the reach shares, the medians and
    the ratio with their intervals and verdicts; `brief`: one line, the
    accuracy and 0.90 only."""
    lines = []
    for f in found:
        res = f["result"]
        a, b, acc = res["a"], res["b"], res["accuracy"]
        head = (f"- **{f['claim']}** ({f['machine']}; n = {a['n']} vs "
                f"{b['n']}): final accuracy {a['mean']:.4f} vs {b['mean']:.4f},"
                f" difference {_interval(acc['diff'], acc['low'], acc['high'], 4)}"
                f" **{acc['verdict']}**")
        per = []
        for t in targets:
            x = res["targets"][t]
            if not (x["a_reached"] or x["b_reached"]) or (brief and t != 0.90):
                continue
            per.append(
                f"{t}: reached {x['a_reached']}/{a['n']} vs "
                f"{x['b_reached']}/{b['n']} (Fisher p = {x['fisher_p']:.3f}), "
                f"median updates {_interval(*x['a_median'])} vs "
                f"{_interval(*x['b_median'])}, ratio "
                f"{_interval(*x['ratio'], 3)} **{x['verdict']}** (among the "
                f"seeds that reach it: {_interval(*x['reaching_ratio'], 3)})")
        if brief:
            lines.append(head + "".join(f"; {p}" for p in per) + ".")
        else:
            lines += [head + f". Rates chosen on: {f['chosen_on']}."]
            lines += [f"  - {p}." for p in per]
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
            values = [stats.updates_to(plans.points(r), t) for r in group]
            m, lo, hi = stats.bootstrap_median(values)
            reached = sum(v is not None for v in values)
            cells.append(f"{_interval(m, lo, hi)} ({reached}/{len(group)})"
                         if len(group) > 1 else f"{_fmt(m)} ({reached}/1)")
        lines.append("| " + " | ".join(str(x) for x in key) + f" | {len(group)} | "
                     + (f"{mean:.4f} ± {sd:.4f}" if sd is not None
                        else f"{mean:.4f} (one seed)") + " | "
                     + " | ".join(cells) + " |")
    return lines


def front_lines(runs):
    lines = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        for t in TARGETS:
            best = front(runs, machine, t)
            if len(best) < 2:
                continue
            lines.append(f"- {machine}, {t}: " + "; ".join(
                f"{b:,} at {rate:g} → "
                f"{_fmt(stats.median(a.updates_to[t]))} "
                f"(n={len(a.seeds)})" for b, (rate, a) in best.items()))
    return lines


def retired_lines(results=runner.RESULTS):
    """Each retired study's runs, one row each (`RETIRED`)."""
    lines = []
    for name, about in RETIRED.items():
        with open(os.path.join(results, name + ".json")) as f:
            record = json.load(f)
        runs = record.get("runs") or record.get("results") or [
            dict(v, backend=k) for k, v in record.get("images_per_sec", {}).items()]
        fields = [k for k in SHOWN if runs and k in runs[0]]
        lines += ["", f"### `{name}.json`: {about} ({record.get('machine', '?')})",
                  "", "| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
        lines += ["| " + " | ".join(f"{r.get(k):.4g}" if isinstance(r.get(k), float)
                                    else str(r.get(k, "–")) for k in fields) + " |"
                  for r in runs]
    return lines


def speed_lines(results=runner.RESULTS):
    """The `backend_speed` plan: second-epoch training images/s per machine
    and backend, the mean of the runs side by side."""
    rows = {}
    for r in runner.load(plans.BACKEND_SPEED.path(results)):
        rows.setdefault((r["machine"].rsplit(",", 1)[0], r["batch"]), []).append(
            r["images_per_sec_per_epoch"][-1])
    return ["| machine (backend) | batch | images/s (mean of the runs side by "
            "side) |", "|---|---|---|"] + [
        f"| {m} | {b:,} | {sum(v) / len(v):,.0f} (n={len(v)}) |"
        for (m, b), v in sorted(rows.items())]


def kill_lines(results=runner.RESULTS):
    """The `kills` plan: per setup and fault (none, or the newest checkpoint
    damaged after the kill), its kills, the identical resumes, the updates
    a kill lost and a kill's seconds (kill and rerun)."""
    lines = ["| setup | fault | machine | kills | identical resumes | updates "
             "lost: max | median | seconds a kill |",
             "|---|---|---|---|---|---|---|---|"]
    runs = runner.load(plans.KILL_RUNS.path(results))
    for fault in (None, "damage"):
        for setup in kills.SETUPS:
            mine = [r for r in runs
                    if r["setup"] == setup and r.get("fault") == fault]
            lost = [r["steps_lost"] for r in mine
                    if r["steps_lost"] is not None]
            if mine:
                lines.append(
                    f"| {setup} | {fault or 'none'} | {mine[-1]['machine']} | "
                    f"{len(mine)} | {sum(r['identical'] for r in mine)} | "
                    f"{max(lost, default='–')} | "
                    f"{_fmt(stats.median(lost), 1) if lost else '–'} | "
                    f"{stats.median([r['wall_seconds'] for r in mine]):.0f} |")
    return lines


def _target(t):
    return f"{t:.2f}" if round(t, 2) == t else f"{t:.3f}"


def shortfall(n_a, n_b):
    """Why a comparison of arms of `n_a` and `n_b` seeds has no interval:
    "not run yet (n = 0)", "n = 1, no interval", or None."""
    if min(n_a, n_b) == 0:
        return "not run yet (n = 0)"
    if min(n_a, n_b) == 1:
        return "n = 1, no interval"
    return None


def ramp_sentence(result):
    """What the defaults against the fixed ramp say, from their verdicts:
    where the grown batch is ahead, the measurements add something there;
    where neither is, the ramp matched it within the intervals."""
    verdicts = [("final accuracy", result["accuracy"]["verdict"])] + [
        (_target(t), result["targets"][t]["verdict"]) for t in TARGETS]
    ahead = [name for name, word in verdicts if word == "ahead"]
    behind = [name for name, word in verdicts if word == "behind"]
    if not ahead and not behind:
        return ("The fixed ramp matches the grown batch within these "
                "intervals (no verdict either way, on final accuracy or at "
                "any target; not an equivalence test): the noise scale told "
                "the schedule, and that schedule written in advance did as "
                "well.")
    parts = []
    if ahead:
        parts.append("the grown batch is ahead of the fixed ramp on "
                     + ", ".join(ahead) + ": measuring the noise scale adds "
                     "something the written schedule lacks there")
    if behind:
        parts.append("the fixed ramp is ahead of the grown batch on "
                     + ", ".join(behind))
    return "; ".join(parts).capitalize() + "."


def baseline_findings(runs):
    """The defaults against each of `BASELINE_ARMS` on `BASELINE_MACHINE`
    and the decisive seeds: [{name, machine, chosen_on, n (a, b), status
    (`shortfall`), result (`stats.compare`, None with a status), ramp (its
    `ramp_sentence`, the ramp only)}]."""
    here = [r for r in runs if r["kind_of_machine"] == BASELINE_MACHINE]
    a = arm(here, "defaults", seeds=D, **DEFAULTS)
    out = []
    for name, sel, chosen in BASELINE_ARMS:
        b = arm(here, name, seeds=D, **sel)
        n = (len(a.seeds), len(b.seeds))
        status = shortfall(*n)
        result = None if status else stats.compare(a, b, TARGETS)
        out.append(dict(name=name, machine=BASELINE_MACHINE, chosen_on=chosen,
                        n=n, status=status, result=result,
                        ramp=ramp_sentence(result)
                        if result and sel["kind"] == "ramp" else None))
    return out


def baseline_lines(found):
    """One line a baseline: final accuracy and, per target, the ratio of
    median updates (defaults / baseline) with its verdict, the seeds that
    reach it and the ratio among those alone."""
    lines = []
    for f in found:
        head = (f"- **The defaults (grown from 128 at 0.4) against "
                f"{f['name']}** ({f['machine']}; seeds {D[0]}–{D[-1]}; n = "
                f"{f['n'][0]} vs {f['n'][1]}")
        if f["status"]:
            lines.append(head + f"): {f['status']}.")
            continue
        res, acc = f["result"], f["result"]["accuracy"]
        parts = [f"final accuracy {res['a']['mean']:.4f} vs "
                 f"{res['b']['mean']:.4f}, difference "
                 f"{_interval(acc['diff'], acc['low'], acc['high'], 4)} "
                 f"**{acc['verdict']}**"]
        for t in TARGETS:
            x = res["targets"][t]
            parts.append(
                f"{_target(t)}: updates ratio {_interval(*x['ratio'], 3)} "
                f"**{x['verdict']}** (reached {x['a_reached']}/{f['n'][0]} "
                f"vs {x['b_reached']}/{f['n'][1]}; among those, "
                f"{_interval(*x['reaching_ratio'], 3)})")
        lines.append(head + f"; {f['chosen_on']}): " + "; ".join(parts) + "."
                     + (f" {f['ramp']}" if f["ramp"] else ""))
    return lines


def depth_best(runs, batch, epochs=plans.DEPTH_EPOCHS):
    """{optimizer: (best rate, the next rate of its sweep or None)} of each
    sweep of 4 rates or more on the choosing seed (`plans.depth_next`: the
    plan's own choice, from the choosing seed's runs on every kind)."""
    out = {}
    for o in plans.DEPTH_OPTIMIZERS:
        swept = [r for r in runs if r.get("workload") == DEPTH_WORKLOAD
                 and r["optimizer"] == o and r["batch"] == batch
                 and r["epochs"] == epochs and r["seed"] in plans.DEPTH_CHOOSE]
        if len(swept) >= 4:
            out[o] = plans.depth_next(o, batch, swept)
    return out


def _depth_arm(runs, o, rate, batch, epochs, seeds=plans.DEPTH_MEASURE):
    return arm(runs, OPTIMIZER_NAMES[o], DEPTH_TARGETS, workload=DEPTH_WORKLOAD,
               optimizer=o, batch=batch, epochs=epochs, rate=rate, seeds=seeds)


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
    elsewhere)."""
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
    rate = recipe.peak_learning_rate("lars_mixed", 0, batch)
    warmup = recipe.warmup_epochs_for("lars_mixed", "auto", batch, epochs)
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
            plans.points(r), 0.90)) for r in chose],
        measured=arms["lars_mixed"]["n"] if measured else 0,
        is_best=measured) if chose is not None else None
    for a in arms.values():
        a.pop("arm")
    return dict(network=DEPTH_NAME, batch=batch, epochs=epochs, machine=kind,
                machine_why=why, arms=arms, pairs=pairs, default=default)


def depth_finding_lines(found):
    """The depth findings, each naming the network and batch: final
    accuracy (Welch), reach of 0.90 (Fisher), updates to 0.90 (bootstrap),
    verdicts; then the default's row."""
    seeds = "–".join(map(str, (plans.DEPTH_MEASURE[0], plans.DEPTH_MEASURE[-1])))
    lines = []
    where = found["machine_why"]
    for f in found["pairs"]:
        a, b = found["arms"][f["a"]], found["arms"][f["b"]]
        head = (f"- **{f['claim']}** ({found['epochs']} epochs; seeds {seeds}; "
                f"{found['machine'] or 'no machine yet'}; n = {f['n'][0]} vs "
                f"{f['n'][1]}")
        if f["status"] or f["result"] is None:
            lines.append(head + f"): {f['status']}.")
            continue
        res, acc = f["result"], f["result"]["accuracy"]
        x = res["targets"][0.90]
        lines.append(
            head + f"; rates {a['rate']:.4g} and {b['rate']:.4g}, each its "
            f"sweep's best on seed {plans.DEPTH_CHOOSE[0]}): final accuracy "
            f"{res['a']['mean']:.4f} vs {res['b']['mean']:.4f}, difference "
            f"{_interval(acc['diff'], acc['low'], acc['high'], 4)} "
            f"**{acc['verdict']}**; 0.90 reached {x['a_reached']}/{f['n'][0]}"
            f" vs {x['b_reached']}/{f['n'][1]} (Fisher p = {x['fisher_p']:.3f})"
            f", median updates {_interval(*x['a_median'])} vs "
            f"{_interval(*x['b_median'])}, ratio {_interval(*x['ratio'], 3)} "
            f"**{x['verdict']}**.")
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
                    f"after {_fmt(c['updates_to_090'])} updates")
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
    """LARS at depth (`plans.DEPTH`, `DEPTH_REDUCED`), per budget: each
    optimizer and batch's runs on the choosing seed with their machine kind
    (final accuracy and training loss, updates to `DEPTH_TARGETS`), the
    sweep's best marked (from the runs of every kind, as the plan chooses;
    said when it lies at the grid's edge); then, per batch, the findings on
    the measuring seeds (`depth_findings`)."""
    deep = [r for r in runs if r.get("workload") == DEPTH_WORKLOAD]
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
                            _fmt(stats.updates_to(plans.points(r), t))
                            for t in DEPTH_TARGETS) + f" | {mark} |")
        for b in batches:
            lines += ["", f"At {b:,}, each optimizer at its best rate on "
                      f"seeds {', '.join(map(str, plans.DEPTH_MEASURE))}:", ""]
            lines += depth_finding_lines(depth_findings(here, b, epochs))
    return lines


def write(results=runner.RESULTS):
    runs = load_all(results)
    found = [f for c in COMPARISONS for f in comparison(runs, *c)]
    pooled = pools(runs)
    baselines = baseline_findings(runs)
    depth = depth_findings(runs)
    lines = ["# The study's report (generated by `python -m bench.study "
             "report`)", "", "## Findings", "",
             "The command's defaults against each baseline (ratios of median "
             "updates: defaults / baseline, below 1 fewer; `among those`: the "
             "same among the seeds that reach the target only):", ""]
    lines += baseline_lines(baselines)
    lines += floor_line(runs)
    lines += ["", f"LARS at depth ({DEPTH_NAME}, Fashion-MNIST; each arm at "
              "its sweep's best rate on the choosing seed, measured on "
              "others):", ""] + depth_finding_lines(depth)
    lines += ["", "Earlier comparisons (seeds that chose a rate also measure "
              "it):", ""]
    lines += finding_lines([f for f in found if f["claim"]
                            != COMPARISONS[0][0]], brief=True)
    lines += ["", "## The findings in detail", ""] + finding_lines(found)
    lines += ["", "## Same configuration on two machine kinds", ""]
    lines += [f"- {p['name']}: {p['machines'][0]} vs {p['machines'][1]} (n "
              f"{p['n'][0]}, {p['n'][1]}): difference "
              f"{_interval(p['diff'], p['low'], p['high'], 4)} (90%); equal "
              "within ±0.002: " + ("shown, so pooled" if p["passes"] else
                                   "not shown, so not pooled (this does not "
                                   "show the kinds differ)")
              for p in pooled]
    lines += ["", "## The front: each fixed batch's best SGD rate per target "
              "(seeds 0-9, per machine kind)", ""] + front_lines(runs)
    lines += ["", "## The grown batch's trade-off (24 epochs, SGD; a variant's "
              "flags in `bench/study/plans.py`, `GROWN`)", ""] + tradeoff_lines(runs)
    lines += ["", "## LARS at depth (ResNet-20 w16, `depth` / "
              "`depth_reduced`)"] + depth_lines(runs)
    lines += ["", "## Every configuration (median updates with a bootstrap "
              "95% interval; seeds reaching the target)", ""]
    lines += config_table(runs)
    lines += probes.markdown(runner.load(plans.PROBES.path(results)))
    lines += ["", "## Training speed per backend (`backend_speed`)", ""]
    lines += speed_lines(results)
    lines += ["", "## Kill and resume (`kills`; a checkpoint every "
              f"{kills.EVERY} updates: a kill may lose at most {kills.EVERY})",
              ""] + kill_lines(results)
    lines += ["", "## Retired studies' records"] + retired_lines(results)
    with open(os.path.join(results, "study.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(results, "study.json"), "w") as f:
        json.dump(dict(findings=found, baselines=baselines, depth=depth,
                       pools=pooled), f, indent=1,
                  default=lambda x: None if x != x else str(x))
    return lines
