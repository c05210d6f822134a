"""Momentum tuned as LARS was (issues 60 and 74, the plan `momentum`): Nesterov
SGD swept on the choosing seed (a grid of two warmups x five rates, then its
warmup bracketed: `engine.momentum_chain`), against LARSMixed and LAMBMixed
at theirs, against plain momentum at its own warmup and rate, and, once
its warmup is bracketed at a point other than the grid's best, against
itself at the grid's best (what the bracket bought); each chosen among the
runs of one machine kind and measured on seeds 101-105 of that kind. Every
kind with runs of the sweep is its own comparison, the decisive kind
(`plans.MOMENTUM_KIND`) first. An arm short of its plan's
seeds (one left out as incomplete: `selection.left_out`) is interim."""

from bench.study import engine
from bench.study import plans
from bench.study import show
from bench.study import stats
from bench.study.depth import DEPTH_NAME
from bench.study.depth import DEPTH_TARGETS
from bench.study.depth import DEPTH_WORKLOAD
from bench.study.selection import arm
from bench.study.selection import interim
from bench.study.selection import shortfall

NAMES = {"nesterov": "Nesterov SGD", "plain": "plain momentum SGD",
         "grid": "its grid's best",
         "lars_mixed": "LARSMixed", "lamb_mixed": "LAMBMixed"}
PAIRS = (("lars_mixed", "nesterov"), ("lamb_mixed", "nesterov"),
         ("nesterov", "plain"))
# Once the warmup is bracketed away from the grid's best: the bracketed best
# against the grid's best (issue 60's arm), on the same measuring seeds.
GRID_PAIR = ("nesterov", "grid")


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


def _points(points):
    return ", ".join(f"{r:g} at warmup {w:.3g}" for w, r in points)


def _nesterov_status(chain, swept):
    """Why the Nesterov arm has no point to measure yet, or None."""
    if chain.best is None:
        return (f"not run yet: the sweep on seed {plans.DEPTH_CHOOSE[0]} has "
                f"{swept} of {len(engine.momentum_grid())} runs of its grid")
    if chain.grid_best is None:
        return (f"not run yet: the grid's best, {chain.best[1]:g}, lies at "
                f"its edge; {_points(chain.next)} runs first")
    return None


def momentum_findings(runs, kind=None):
    """{machine, swept (runs of the Nesterov grid on that kind), chain
    (`engine.momentum_chain`), best (the chain's best so far), bracketed
    (its warmup and rate bracketed), nesterov_at ((warmup, rate) the
    Nesterov arm is measured at: the bracketed best, else the grid's best,
    issue 60's arm), grid_at (the grid's best where the bracketed best is
    another point, else None), rates {optimizer: (best, beyond)}, arms
    {name: n, seeds}, pairs [{claim, a, b, n, status, interim, result}]}:
    each layer-wise optimizer at its best rate on machine kind `kind`
    (default: `momentum_machine`; `engine.layerwise_best`) against Nesterov
    SGD there, Nesterov SGD against plain momentum at the bracketed best,
    and with `grid_at` the bracketed best against the grid's best
    (`GRID_PAIR`), on `plans.MOMENTUM_MEASURE` of that kind; an arm short
    of those seeds gives interim verdicts (`selection.interim`), counted
    nowhere."""
    kind = kind or momentum_machine(runs)
    here = [r for r in runs if r["kind_of_machine"] == kind]
    chain = (engine.momentum_chain(here, kind) if kind
             else engine.Chain(None, None, [], []))
    bracketed = chain.best is not None and not chain.next
    at = chain.best if bracketed else chain.grid_best
    grid_at = (chain.grid_best if bracketed
               and chain.grid_best not in (None, chain.best) else None)
    rates = {o: engine.layerwise_best(here, o, kind) if kind else (None, None)
             for o in plans.LAYERWISE}
    common = dict(workload=DEPTH_WORKLOAD, batch=plans.MOMENTUM_BATCH,
                  epochs=plans.DEPTH_EPOCHS, seeds=plans.MOMENTUM_MEASURE)
    arms = {o: arm(here, NAMES[o], DEPTH_TARGETS, optimizer=o,
                   rate=rate if rate is not None else -1, variant=None,
                   **common) for o, (rate, _) in rates.items()}
    for name, point, prefix in (("nesterov", at, "nesterov"),
                                ("plain", chain.best if bracketed else None,
                                 "momentum"),
                                ("grid", grid_at, "nesterov")):
        arms[name] = arm(
            here, NAMES[name], DEPTH_TARGETS, optimizer="sgd",
            rate=point[1] if point else -1,
            variant=f"{prefix}_w{point[0]:.3g}" if point else "-", **common)
    swept = sum(engine.momentum_key(r["warmup_epochs"], r["rate"])
                in engine.momentum_grid() for r in _sweep(here))
    planned = len(plans.MOMENTUM_MEASURE)
    pairs = []
    for a, b in PAIRS + ((GRID_PAIR,) if grid_at else ()):
        n = (len(arms[a].seeds), len(arms[b].seeds))
        status = shortfall(*n)
        if a in plans.LAYERWISE:
            rate, edge = rates[a]
            if rate is None:
                status = (f"not run yet: {NAMES[a]}'s rates on seed "
                          f"{plans.DEPTH_CHOOSE[0]} on this kind are fewer "
                          "than 3")
            elif edge is not None:
                status = (f"not run yet: {NAMES[a]}'s best on this kind, "
                          f"{rate:g}, lies at its sweep's edge; {edge:g} "
                          "runs first")
        elif not bracketed and chain.grid_best is not None:
            status = ("not run yet: Nesterov SGD's warmup is bracketed first "
                      f"(next on seed {plans.DEPTH_CHOOSE[0]}: "
                      f"{_points(chain.next)})")
        status = _nesterov_status(chain, swept) or status
        result = None if status else stats.compare(arms[a], arms[b],
                                                   DEPTH_TARGETS)
        short = result is not None and min(n) < planned
        pairs.append(dict(
            claim=f"{NAMES[a]} against {NAMES[b]}, {DEPTH_NAME} at "
                  f"{plans.MOMENTUM_BATCH:,} on {kind or 'no machine yet'}",
            a=a, b=b, n=n, status=status, interim=short,
            result=interim(result) if short else result))
    return dict(machine=kind, swept=swept, chain=chain._asdict(),
                best=chain.best, bracketed=bracketed, nesterov_at=at,
                grid_at=grid_at,
                rates=rates, arms={k: dict(n=len(v.seeds), seeds=list(v.seeds))
                                   for k, v in arms.items()}, pairs=pairs)


def _at(found):
    """How the page names the Nesterov arm's point."""
    warmup, rate = found["nesterov_at"]
    how = ("its rate and warmup bracketed" if found["bracketed"] else
           "the grid's best, its warmup not yet bracketed (next: "
           + _points(found["chain"]["next"]) + ")")
    return f"{rate:g} at warmup {warmup:.3g} epochs, {how}"


def momentum_lines(found):
    """The sweep's state, then one line a pair (`show.pair`: final
    accuracy, reach of and updates to 0.90, with verdicts; the exact rank
    test beside the updates at 5 seeds a side or fewer)."""
    seeds = plans.MOMENTUM_MEASURE
    chain = found["chain"]
    head = (f"- **Nesterov SGD's sweep** ({DEPTH_NAME} at "
            f"{plans.MOMENTUM_BATCH:,}, {plans.DEPTH_EPOCHS} epochs; rates "
            f"{', '.join(f'{x:g}' for x in plans.MOMENTUM_RATES)} at warmups "
            f"{', '.join(f'{w:.3g}' for w in plans.MOMENTUM_WARMUPS)} epochs "
            f"on seed {plans.DEPTH_CHOOSE[0]}, then warmups "
            f"{', '.join(f'{w:g}' for w in plans.MOMENTUM_LONGER)} while the "
            f"best lies at the longest; {found['machine'] or 'no machine yet'})"
            ": ")
    if found["best"] is None:
        head += f"{found['swept']} run(s) of its grid so far."
    elif chain["grid_best"] is None:
        head += (f"the grid's best, {found['best'][1]:g}, lies at its edge "
                 f"({_points(chain['next'])} next).")
    else:
        grid = chain["grid_best"]
        head += f"the grid's best {grid[1]:g} at warmup {grid[0]:.3g}"
        head += (f"; bracketed, the best is {found['best'][1]:g} at warmup "
                 f"{found['best'][0]:.3g}" if found["bracketed"] else
                 f"; its warmup bracket runs next: {_points(chain['next'])}")
        head += "."
    lines = [head]
    for f in found["pairs"]:
        where = f"seeds {seeds[0]}–{seeds[-1]}; "
        if f["status"]:
            lines.append(show.finding(f["claim"], where, f["n"], f["status"]))
            continue
        if f["b"] == "plain":
            how = (f"both at {found['nesterov_at'][1]:g}, warmup "
                   f"{found['nesterov_at'][0]:.3g} epochs, Nesterov's "
                   f"bracketed best on seed {plans.DEPTH_CHOOSE[0]}")
        elif f["b"] == "grid":
            grid = found["grid_at"]
            how = (f"{found['nesterov_at'][1]:g} at warmup "
                   f"{found['nesterov_at'][0]:.3g} epochs, the bracketed "
                   f"best, against {grid[1]:g} at warmup {grid[0]:.3g}, the "
                   f"grid's best, both on seed {plans.DEPTH_CHOOSE[0]}")
        else:
            how = (f"{NAMES[f['a']]} at {found['rates'][f['a']][0]:g}, its "
                   f"best on seed {plans.DEPTH_CHOOSE[0]} on that kind; "
                   f"Nesterov SGD at {_at(found)}")
        lines.append(show.finding(
            f["claim"], where, f["n"], planned=f["interim"] and len(seeds),
            how=how, said=show.pair(f["result"], f["n"])))
    return lines


def _commit(r):
    return ((r.get("code") or {}).get("commit") or "none")[:7]


def sweep_lines(runs):
    """Per machine kind of `momentum_kinds`, a table of the runs on seed
    100 that chose each arm's rate there: the Nesterov sweep (its grid and
    the chain beyond it) and each layer-wise optimizer's rates on that kind
    (the depth plan's and this plan's), with final accuracy, final training
    loss, updates to 0.90 and the commit each run's record names; each best
    marked, the runs a chain added, and what runs next."""
    lines = []
    for kind in momentum_kinds(runs):
        chain = engine.momentum_chain(runs, kind)
        chains = {"nesterov": (chain.best, chain.next, chain.ran)}
        for o in plans.LAYERWISE:
            best, beyond, ran = engine.layerwise_chain(runs, o, kind)
            chains[o] = (best, [beyond] if beyond else [], ran)
        lines += ["", f"{kind}, seed {plans.DEPTH_CHOOSE[0]}:", "",
                  "| optimizer | warmup (epochs) | rate | final val acc | "
                  "final train loss | updates to 0.90 | commit | |",
                  "|---|---|---|---|---|---|---|---|"]
        for name in ("nesterov",) + plans.LAYERWISE:
            best, following, ran = chains[name]
            added = {engine.momentum_key(*k) for k in ran}
            swept = engine.momentum_swept(runs, kind, name)
            for key, r in sorted(swept.items()):
                marks = [m for m, on in (
                    ("best", best is not None
                     and key == engine.momentum_key(*best)),
                    ("the grid's best", name == "nesterov"
                     and chain.grid_best not in (None, best)
                     and key == engine.momentum_key(*chain.grid_best)),
                    ("added by the chain", key in added)) if on]
                lines.append(
                    f"| {NAMES[name]} | {r['warmup_epochs']:.3g} | "
                    f"{r['rate']:g} | {r['val_accuracy']:.4f} | "
                    f"{r['train_loss_per_epoch'][-1]:.3f} | "
                    + show.number(stats.updates_to(engine.points(r), 0.90))
                    + f" | {_commit(r)} | {', '.join(marks)} |")
            if following:
                lines.append(f"| {NAMES[name]} | next: {_points(following)}"
                             " | | | | | | |")
    return lines
