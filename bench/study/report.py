"""The study's report, computed from the records: `bench/results/study.md`
and `study.json` (the same numbers).

A configuration's runs are grouped per machine kind and pooled across kinds
only where `stats.same_machine_test` passes (`POOLS`). Each finding of
`COMPARISONS` names its two arms, the seeds each is measured on and those
its rate was chosen on; the verdict words come from the intervals.
"""

import json
import math
import os

import kills
import plans
import probes
import runner
import stats

TARGETS = (0.88, 0.89, 0.90, 0.905)
# ResNet-20 w16 gets further: LARS at depth is read at these.
DEPTH_TARGETS = (0.90, 0.92, 0.93)
RECORDS = ("batch_scaling_study", "large_batch_study", "lars_depth_study")
# Records of retired studies, listed run by run with the `SHOWN` fields
# they have.
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
    """Every run of every record, each with its machine kind."""
    runs = []
    for name in RECORDS:
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
    ("The command's defaults (grown from 128 at 0.4) against the best tuned "
     "fixed batch for 0.90 (1,024 at 0.8)",
     dict(kind="grown", variant="default", rate=0.4, epochs=24, seeds=D),
     dict(kind="fixed", batch=1024, rate=0.8, epochs=24, optimizer="sgd",
          seeds=D),
     "0.4: fixed 128's best of 0.1/0.2/0.4, seeds 0-2; 0.8: 1,024's best of "
     "0.4-3.2, seeds 0-4", range(5)),
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
# The goal's floor: the small batch's final accuracy (fixed 128, 0.907).
FLOOR = 0.907
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
    """The defaults' final accuracy on the decisive seeds against `FLOOR`."""
    lines = []
    for machine in sorted({r["kind_of_machine"] for r in runs}):
        a = arm([r for r in runs if r["kind_of_machine"] == machine], "a",
                **dict(COMPARISONS[0][1]))
        if len(a.seeds) >= 2:
            mean, lo, hi = stats.mean_interval(a.final)
            lines.append(
                f"- **The defaults end at the small batch's accuracy (>= "
                f"{FLOOR})** ({machine}; n = {len(a.seeds)}): "
                f"{_interval(mean, lo, hi, 4)}: **"
                + stats.verdict(lo, hi, "higher", FLOOR).replace(
                    "ahead", "above").replace("behind", "below") + "**.")
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
                f"{_interval(*x['ratio'], 3)} **{x['verdict']}**")
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
    for r in runner.load(os.path.join(results, "backend_speed.json")):
        rows.setdefault((r["machine"].rsplit(",", 1)[0], r["batch"]), []).append(
            r["images_per_sec_per_epoch"][-1])
    return ["| machine (backend) | batch | images/s (mean of the runs side by "
            "side) |", "|---|---|---|"] + [
        f"| {m} | {b:,} | {sum(v) / len(v):,.0f} (n={len(v)}) |"
        for (m, b), v in sorted(rows.items())]


def kill_lines(results=runner.RESULTS):
    """The `kills` plan: per setup, its kills, the identical resumes, the
    updates a kill lost and a kill's seconds (kill and rerun)."""
    lines = ["| setup | machine | kills | identical resumes | updates lost: "
             "max | median | seconds a kill |", "|---|---|---|---|---|---|---|"]
    runs = runner.load(os.path.join(results, "kill_campaign.json"))
    for setup in kills.SETUPS:
        mine = [r for r in runs if r["setup"] == setup]
        lost = [r["steps_lost"] for r in mine if r["steps_lost"] is not None]
        if mine:
            lines.append(
                f"| {setup} | {mine[-1]['machine']} | {len(mine)} | "
                f"{sum(r['identical'] for r in mine)} | {max(lost, default='–')}"
                f" | {_fmt(stats.median(lost), 1) if lost else '–'} | "
                f"{stats.median([r['wall_seconds'] for r in mine]):.0f} |")
    return lines


def depth_lines(runs):
    """LARS at depth (`plans.DEPTH`, `DEPTH_REDUCED`), per machine kind and
    budget: each optimizer and batch's sweep on the choosing seed (final
    accuracy and training loss, updates to `DEPTH_TARGETS`), its best rate
    marked (and said when it lies at the grid's edge: the sweep did not
    bracket it); then LARSMixed and LAMBMixed against SGD at their best
    rates on the measuring seeds, or that those have not run."""
    deep = [r for r in runs if r.get("workload") == "resnet20_w16"]
    lines = []
    for machine, epochs in sorted({(r["kind_of_machine"], r["epochs"])
                                   for r in deep}):
        here = [r for r in deep if r["kind_of_machine"] == machine
                and r["epochs"] == epochs]
        batches = sorted({r["batch"] for r in here})
        lines += ["", f"### {machine}, {epochs} epochs: each rate on seed "
                  f"{', '.join(map(str, plans.DEPTH_CHOOSE))}", "",
                  "| optimizer | batch | rate | final val acc | final train "
                  "loss | " + " | ".join(f"updates to {t}" for t in
                                         DEPTH_TARGETS) + " | |",
                  "|" + "---|" * (6 + len(DEPTH_TARGETS))]
        best = {}
        for o in plans.DEPTH_OPTIMIZERS:
            for b in batches:
                swept = sorted((r for r in here if r["optimizer"] == o
                                and r["batch"] == b
                                and r["seed"] in plans.DEPTH_CHOOSE),
                               key=lambda r: r["rate"])
                if not swept:
                    continue
                best[o, b], edge = plans.sweep_best(swept)
                for r in swept:
                    mark = ("best" + (", at the grid's edge" if edge else "")
                            if round(r["rate"], 9) == best[o, b] else "")
                    lines.append(
                        f"| {o} | {b:,} | {r['rate']:.4g} | "
                        f"{r['val_accuracy']:.4f} | "
                        f"{r['train_loss_per_epoch'][-1]:.3f} | " + " | ".join(
                            _fmt(stats.updates_to(plans.points(r), t))
                            for t in DEPTH_TARGETS) + f" | {mark} |")
        lines += ["", "LARSMixed and LAMBMixed against SGD, each at its best "
                  f"rate, on seeds {', '.join(map(str, plans.DEPTH_MEASURE))}:",
                  ""]
        for b in batches:
            sgd = arm(here, "SGD", DEPTH_TARGETS, optimizer="sgd", batch=b,
                      rate=best.get(("sgd", b), -1), seeds=plans.DEPTH_MEASURE)
            for o in ("lars_mixed", "lamb_mixed"):
                other = arm(here, o, DEPTH_TARGETS, optimizer=o, batch=b,
                            rate=best.get((o, b), -1), seeds=plans.DEPTH_MEASURE)
                if min(len(other.seeds), len(sgd.seeds)) < 2:
                    lines.append(f"- {o} against SGD at {b:,}: not run yet "
                                 f"(n = {len(other.seeds)} and {len(sgd.seeds)})")
                    continue
                lines += finding_lines([dict(
                    claim=f"{o} against SGD at {b:,}", machine=machine,
                    chosen_on=f"seed {plans.DEPTH_CHOOSE[0]}",
                    result=stats.compare(other, sgd, DEPTH_TARGETS))],
                    targets=DEPTH_TARGETS)
    return lines


def write(results=runner.RESULTS):
    runs = load_all(results)
    found = [f for c in COMPARISONS for f in comparison(runs, *c)]
    pooled = pools(runs)
    lines = ["# The study's report (generated by `python bench/study.py "
             "report`)", "", "## Findings", ""]
    lines += finding_lines(found, brief=True) or [
        "- none with 2 seeds or more per arm"]
    lines += floor_line(runs)
    lines += ["", "## The findings in detail", ""] + finding_lines(found)
    lines += ["", "## Same configuration on two machine kinds", ""]
    lines += [f"- {p['name']}: {p['machines'][0]} vs {p['machines'][1]} (n "
              f"{p['n'][0]}, {p['n'][1]}): difference "
              f"{_interval(p['diff'], p['low'], p['high'], 4)}; pooled: "
              f"{'yes' if p['passes'] else 'no'}" for p in pooled]
    lines += ["", "## The front: each fixed batch's best SGD rate per target "
              "(seeds 0-9, per machine kind)", ""] + front_lines(runs)
    lines += ["", "## The grown batch's trade-off (24 epochs, SGD; a variant's "
              "flags in `bench/study/plans.py`, `GROWN`)", ""] + tradeoff_lines(runs)
    lines += ["", "## LARS at depth (ResNet-20 w16, `depth` / "
              "`depth_reduced`)"] + depth_lines(runs)
    lines += ["", "## Every configuration (median updates with a bootstrap "
              "95% interval; seeds reaching the target)", ""]
    lines += config_table(runs)
    lines += probes.markdown(runner.load(os.path.join(
        results, "critical_batch_probe.json")))
    lines += ["", "## Training speed per backend (`backend_speed`)", ""]
    lines += speed_lines(results)
    lines += ["", "## Kill and resume (`kills`; a checkpoint every "
              f"{kills.EVERY} updates: a kill may lose at most {kills.EVERY})",
              ""] + kill_lines(results)
    lines += ["", "## Retired studies' records"] + retired_lines(results)
    with open(os.path.join(results, "study.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(results, "study.json"), "w") as f:
        json.dump(dict(findings=found, pools=pooled), f, indent=1,
                  default=lambda x: None if x != x else str(x))
    return lines
