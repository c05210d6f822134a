"""The study's findings: the comparisons of two arms, the floor, the pools.

A configuration's runs are grouped per machine kind and pooled across kinds
only where `stats.same_machine_test` passes (`POOLS`). Each finding of
`COMPARISONS` names its two arms, the seeds each is measured on and those
its rate was chosen on; the verdict words come from the intervals."""

import numpy as np

from bench.study import plans
from bench.study import show
from bench.study import stats
from bench.study.selection import TARGETS
from bench.study.selection import arm

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
CPU = "CPU VM / JAX"
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


def floor_findings(runs):
    """The defaults' final accuracy on the decisive seeds against `FLOOR`,
    per machine kind with 2 seeds or more: [{machine, n, mean, low, high
    (Student's t), verdict ("above", "below", "cannot tell")}]."""
    out = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        a = arm([r for r in runs if r["kind_of_machine"] == machine], "a",
                **dict(COMPARISONS[0][1]))
        if len(a.seeds) >= 2:
            mean, lo, hi = stats.mean_interval(a.final)
            out.append(dict(machine=machine, n=len(a.seeds), mean=mean,
                            low=lo, high=hi, verdict=stats.verdict(
                                lo, hi, "higher", FLOOR).replace(
                                "ahead", "above").replace("behind", "below")))
    return out


def floor_line(runs):
    """`floor_findings` in words, with the small batch's own final accuracy
    (`SMALL`) on each kind it ran on."""
    small = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        s = arm([r for r in runs if r["kind_of_machine"] == machine], "s",
                **SMALL)
        if len(s.seeds) >= 2:
            small.append(f"{stats.mean_interval(s.final)[0]:.4f} ± "
                         f"{float(np.std(s.final, ddof=1)):.4f} (n = "
                         f"{len(s.seeds)}, seeds "
                         f"{', '.join(map(str, s.seeds))}, {machine})")
    return [f"- **The defaults' final accuracy against the goal's floor of "
            f"{FLOOR}** ({f['machine']}; n = {f['n']}): "
            f"{show.interval(f['mean'], f['low'], f['high'], 4)}: "
            f"**{f['verdict']}**. The floor is not the small batch's "
            "accuracy: fixed 128 at 0.4 ended at "
            + ("; ".join(small) or "(not recorded)") + "."
            for f in floor_findings(runs)]


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
        n = (res["a"]["n"], res["b"]["n"])
        head = (f"- **{f['claim']}** ({f['machine']}; n = {n[0]} vs {n[1]}): "
                + show.accuracy(res))
        per = []
        for t in targets:
            x = res["targets"][t]
            if not (x["a_reached"] or x["b_reached"]) or (brief and t != 0.90):
                continue
            per.append(f"{t}: {show.reach(x, n)}, {show.updates(x)} (among "
                       "the seeds that reach it: "
                       f"{show.interval(*x['reaching_ratio'], 3)})")
        if brief:
            lines.append(head + "".join(f"; {p}" for p in per) + ".")
        else:
            lines += [head + f". Rates chosen on: {f['chosen_on']}."]
            lines += [f"  - {p}." for p in per]
    return lines
