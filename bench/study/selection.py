"""The runs the study compares, and their selection into arms.

Every complete run of the records of the plans compared (`load_all`)
carries its record's name and its machine kind; a run whose record is short
of its spec (`runspec.incomplete`) is left out of all of them and listed
(`left_out`). `arm` selects the runs of one configuration as a `stats.Arm`
with its updates to each target, `shortfall` says why two arms too small
for an interval have none, and `interim` takes the verdicts of an arm
short of its plan's seeds."""

import os

from bench.core import provenance
from bench.core import records
from bench.core import runspec
from bench.study import engine
from bench.study import stats

TARGETS = (0.88, 0.89, 0.90, 0.905)


def _compared(results):
    for name in dict.fromkeys(p.record for p in engine.PLANS.values()
                              if p.compared):
        for r in records.load(os.path.join(results, name + ".json")):
            yield dict(r, record=name, kind_of_machine=provenance.machine_kind(
                r.get("machine", "CPU VM (JAX)")))


def load_all(results=records.RESULTS):
    """Every complete run of the records of the plans compared
    (`Plan.compared`), each with its record's name and its machine kind;
    a short one (`runspec.incomplete`) is left out of every comparison,
    table and choice the report makes (`left_out` lists it)."""
    return [r for r in _compared(results) if not runspec.incomplete(r)]


def left_out(results=records.RESULTS):
    """[(record, machine kind, key, why)] of the runs `load_all` leaves out:
    those whose record is short of their spec; their plans run them again
    (`pool.run` counts them as not done)."""
    return [(r["record"], r["kind_of_machine"], runspec.run_key(r),
             runspec.incomplete(r))
            for r in _compared(results) if runspec.incomplete(r)]


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
        commits=tuple((r.get("code") or {}).get("commit") or ""
                      for r in chosen),
        processors=tuple(r.get("cpu") or "" for r in chosen),
        updates_to={t: tuple(stats.updates_to(engine.points(r), t) for r in chosen)
                    for t in targets})


def shortfall(n_a, n_b):
    """Why a comparison of arms of `n_a` and `n_b` seeds has no interval:
    "not run yet (n = 0)", "n = 1, no interval", or None."""
    if min(n_a, n_b) == 0:
        return "not run yet (n = 0)"
    if min(n_a, n_b) == 1:
        return "n = 1, no interval"
    return None


def interim(result):
    """`result` (`stats.compare`) with every verdict "interim": an arm
    short of its plan's seeds decides nothing yet."""
    result["accuracy"]["verdict"] = "interim"
    for x in result["targets"].values():
        x["verdict"] = "interim"
    return result
