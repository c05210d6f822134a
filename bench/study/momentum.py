"""Momentum tuned as LARS was (issue 60, `plans.MOMENTUM`): Nesterov SGD
swept at two warmups on the choosing seed, its best against LARSMixed and
LAMBMixed at theirs, each chosen among the runs of one machine kind and
measured on seeds 101-105 of that kind; every kind with runs of the sweep
its own comparison, the decisive kind (`plans.MOMENTUM_KIND`) first."""

from bench.study import plans
from bench.study import show
from bench.study import stats
from bench.study.depth import DEPTH_NAME
from bench.study.depth import DEPTH_TARGETS
from bench.study.depth import DEPTH_WORKLOAD
from bench.study.selection import arm
from bench.study.selection import shortfall

NAMES = {"nesterov": "Nesterov SGD", "lars_mixed": "LARSMixed",
         "lamb_mixed": "LAMBMixed"}
PAIRS = (("lars_mixed", "nesterov"), ("lamb_mixed", "nesterov"))


def _sweep(runs):
    return [r for r in runs if str(r.get("variant", "")).startswith("nesterov")
            and r["seed"] in plans.DEPTH_CHOOSE]


def momentum_machine(runs):
    """The machine kind holding the most runs of the Nesterov sweep (the
    kind its best is chosen on, and the arms measured on); None before
    any."""
    kinds = [r["kind_of_machine"] for r in _sweep(runs)]
    return max(sorted(set(kinds)), key=kinds.count) if kinds else None


def momentum_kinds(runs):
    """The machine kinds with runs of the Nesterov sweep, the decisive kind
    (`plans.MOMENTUM_KIND`) first, then the others by name."""
    kinds = {r["kind_of_machine"] for r in _sweep(runs)}
    return sorted(kinds, key=lambda k: (k != plans.MOMENTUM_KIND, k))


def momentum_all(runs):
    """`momentum_findings` of each kind of `momentum_kinds` (of the
    decisive kind alone, waiting, before any run)."""
    return [momentum_findings(runs, kind)
            for kind in momentum_kinds(runs) or [plans.MOMENTUM_KIND]]


def momentum_findings(runs, kind=None):
    """{machine, swept (runs of the Nesterov sweep on that kind), best
    ((warmup, rate) or None), extending_to, rates {optimizer: (best,
    beyond)}, arms {name: n, seeds}, pairs [{claim, a, b, n, status,
    result}]}: each layer-wise optimizer at its best rate on machine kind
    `kind` (default: `momentum_machine`; `plans.layerwise_best`) against
    Nesterov SGD at its sweep's best there, on `plans.MOMENTUM_MEASURE` of
    that kind."""
    kind = kind or momentum_machine(runs)
    here = [r for r in runs if r["kind_of_machine"] == kind]
    best, beyond = plans.momentum_best(here, kind) if kind else (None, None)
    rates = {o: plans.layerwise_best(here, o, kind) if kind else (None, None)
             for o in plans.LAYERWISE}
    common = dict(workload=DEPTH_WORKLOAD, batch=plans.MOMENTUM_BATCH,
                  epochs=plans.DEPTH_EPOCHS, seeds=plans.MOMENTUM_MEASURE)
    arms = {o: arm(here, NAMES[o], DEPTH_TARGETS, optimizer=o,
                   rate=rate if rate is not None else -1, variant=None,
                   **common) for o, (rate, _) in rates.items()}
    arms["nesterov"] = arm(
        here, NAMES["nesterov"], DEPTH_TARGETS, optimizer="sgd",
        rate=best[1] if best else -1,
        variant=f"nesterov_w{best[0]:.3g}" if best else "-", **common)
    pairs = []
    for a, b in PAIRS:
        n = (len(arms[a].seeds), len(arms[b].seeds))
        status = shortfall(*n)
        rate, edge = rates[a]
        if rate is None:
            status = (f"not run yet: {NAMES[a]}'s rates on seed "
                      f"{plans.DEPTH_CHOOSE[0]} on this kind are fewer than 3")
        elif edge is not None:
            status = (f"not run yet: {NAMES[a]}'s best on this kind, "
                      f"{rate:g}, lies at its sweep's edge; {edge:g} runs "
                      "first")
        if best is None:
            status = (f"not run yet: the sweep on seed "
                      f"{plans.DEPTH_CHOOSE[0]} has {len(_sweep(here))} of "
                      f"{len(plans.MOMENTUM_RATES) * 2} runs")
        elif beyond is not None:
            status = (f"not run yet: the sweep's best, {best[1]:g}, lies at "
                      f"its edge; {beyond[1]:g} runs first")
        pairs.append(dict(
            claim=f"{NAMES[a]} against {NAMES[b]}, {DEPTH_NAME} at "
                  f"{plans.MOMENTUM_BATCH:,} on {kind or 'no machine yet'}",
            a=a, b=b, n=n, status=status,
            result=None if status else stats.compare(
                arms[a], arms[b], DEPTH_TARGETS)))
    return dict(machine=kind, swept=len(_sweep(here)), best=best,
                extending_to=beyond, rates=rates,
                arms={k: dict(n=len(v.seeds), seeds=list(v.seeds))
                      for k, v in arms.items()}, pairs=pairs)


def momentum_lines(found):
    """One line a pair (`show.pair`: final accuracy, reach of and updates
    to 0.90, with verdicts) and each arm's rate; the sweep's best first."""
    seeds = plans.MOMENTUM_MEASURE
    best = found["best"]
    lines = [f"- **Nesterov SGD tuned as LARS was** ({DEPTH_NAME} at "
             f"{plans.MOMENTUM_BATCH:,}, {plans.DEPTH_EPOCHS} epochs; rates "
             f"{', '.join(f'{x:g}' for x in plans.MOMENTUM_RATES)} at warmups "
             f"{', '.join(f'{w:.3g}' for w in plans.MOMENTUM_WARMUPS)} epochs "
             f"on seed {plans.DEPTH_CHOOSE[0]}; "
             f"{found['machine'] or 'no machine yet'}): "
             + (f"{found['swept']} run(s) of the sweep so far." if best is None
                else f"best rate {best[1]:g} at warmup {best[0]:.3g} epochs"
                + (f", at the sweep's edge ({found['extending_to'][1]:g} "
                   "runs next)." if found["extending_to"] else "."))]
    for f in found["pairs"]:
        head = (f"- **{f['claim']}** (seeds {seeds[0]}–{seeds[-1]}; "
                f"n = {f['n'][0]} vs {f['n'][1]}")
        if f["status"]:
            lines.append(head + f"): {f['status']}.")
            continue
        lines.append(
            head + f"; {NAMES[f['a']]} at {found['rates'][f['a']][0]:g}, "
            f"Nesterov SGD at {best[1]:g}, each its best on seed "
            f"{plans.DEPTH_CHOOSE[0]} on that kind): "
            + show.pair(f["result"], f["n"]) + ".")
    return lines


def sweep_lines(runs):
    """Per machine kind of `momentum_kinds`, a table of the runs on seed
    100 that chose each arm's rate there: the Nesterov sweep (both warmups)
    and each layer-wise optimizer's rates on that kind (the depth plan's
    and this plan's), with final accuracy, final training loss and updates
    to 0.90; each best marked, and the runs an edge added (`plans`'
    chains)."""
    lines = []
    for kind in momentum_kinds(runs):
        chains = {"nesterov": plans.momentum_chain(runs, kind)}
        chains.update((o, plans.layerwise_chain(runs, o, kind))
                      for o in plans.LAYERWISE)
        lines += ["", f"{kind}, seed {plans.DEPTH_CHOOSE[0]}:", "",
                  "| optimizer | warmup (epochs) | rate | final val acc | "
                  "final train loss | updates to 0.90 | |",
                  "|---|---|---|---|---|---|---|"]
        for name in ("nesterov",) + plans.LAYERWISE:
            best, beyond, ran = chains[name]
            added = {plans.momentum_key(*k) for k in ran}
            swept = plans.momentum_swept(runs, kind, name)
            for key, r in sorted(swept.items()):
                mark = ", ".join(
                    m for m, on in (
                        ("best", best is not None
                         and key == plans.momentum_key(*best)),
                        ("added at an edge", key in added)) if on)
                if mark == "best" and beyond is not None:
                    mark += f", at the edge: {beyond[1]:g} next"
                lines.append(
                    f"| {NAMES[name]} | {r['warmup_epochs']:.3g} | "
                    f"{r['rate']:g} | {r['val_accuracy']:.4f} | "
                    f"{r['train_loss_per_epoch'][-1]:.3f} | "
                    + show.number(stats.updates_to(plans.points(r), 0.90))
                    + f" | {mark} |")
    return lines
