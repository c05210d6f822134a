"""The study: run a plan's runs, or write the report.

    KERAS_BACKEND=jax python -m bench.study run decisive --workers 2
    KERAS_BACKEND=tensorflow python -m bench.study run baselines --workers 2
    KERAS_BACKEND=jax python -m bench.study run depth_reduced --budget 3600
    python -m bench.study report
    KERAS_BACKEND=tensorflow python -m bench.study list
    python -m bench.study merge OTHER/lars_depth_study.json
    python -m bench.study recheck depth KEY --epochs 2

`run` starts the plan's runs not yet in its record (`bench/results/
<record>.json`), `--workers` processes at a time, none after `--budget`
seconds (the GPU check's plans: `python -m bench.gpu_campaign`, one at a
time); runs that wait on others (a sweep's best rate on new seeds) start
in the same call once those are recorded; a rerun skips the finished runs
and resumes a stopped one from its last epoch checkpoint. A run whose
record is short of its spec (fewer evaluations or updates:
`runspec.incomplete`) is not finished: `run` runs it again, `merge`
refuses it with one line, and the report leaves it out. `recheck` runs a
recorded run's first epochs again at the code checked out now and compares
them epoch by epoch with its record (`recheck.py`). The plans:
`bench/study/plans.py` (one table, read by `engine.py`). Run from the
repository's root (or with it on `PYTHONPATH`).
"""

import argparse
import os
import sys

from bench.core import pool
from bench.core import provenance
from bench.core import records
from bench.core import runspec
from bench.study import engine


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a plan")
    r.add_argument("plan", choices=sorted(engine.PLANS))
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--budget", type=float, default=0.0,
                   help="seconds; no run starts after them (0: no limit)")
    r.add_argument("--work_dir", default=os.path.join("runs", "study"))
    r.add_argument("--data_dir", default="")
    r.add_argument("--results", default=records.RESULTS)
    r.add_argument("--only", default="",
                   help="run only the specs whose key contains this")
    sub.add_parser("report", help="write bench/results/study.md and the "
                                  "findings table of docs/large-batch-study.md")
    ls = sub.add_parser("list", help=(
        "each plan's runs of this machine kind and KERAS_BACKEND: done and "
        "left"))
    ls.add_argument("--results", default=records.RESULTS)
    m = sub.add_parser("merge", help="add another machine's record's runs "
                                     "to the record of the same name here")
    m.add_argument("files", nargs="+")
    c = sub.add_parser("recheck", help="rerun a recorded run's first epochs "
                                       "here and compare them with its record")
    c.add_argument("plan", choices=sorted(engine.PLANS))
    c.add_argument("key", help="the run's key (`list`, or the record's runs)")
    c.add_argument("--epochs", type=int, default=1)
    c.add_argument("--work_dir", default=os.path.join("runs", "recheck"))
    c.add_argument("--results", default=records.RESULTS)
    args = p.parse_args(argv)
    if args.command == "recheck":
        return _recheck(p, args)
    if args.command == "report":
        from bench.study import headline
        from bench.study import report

        print("\n".join(report.write(page=headline.PAGE)))
        return 0
    if args.command == "merge":
        for path in args.files:
            merge(path, os.path.join(records.RESULTS, os.path.basename(path)))
        return 0
    if args.command == "list":
        # Runs are this kind's and backend's (`Plan.specs_here`): say whose.
        print(f"runs here: {provenance.machine()}; KERAS_BACKEND="
              f"{os.environ.get('KERAS_BACKEND', 'jax')} (set it for "
              "another backend's runs)")
        for plan in engine.PLANS.values():
            runs = records.load(plan.path(args.results))
            failed = {runspec.run_key(x)
                      for x in records.failures(plan.path(args.results))}
            done = runspec.finished_keys(runs) | failed
            keys = [runspec.run_key(s) for s in plan.specs_here(runs)]
            left = sum(k not in done for k in keys)
            print(f"{plan.name:14s} {len(keys) - left:4d} done {left:4d} left"
                  f"  {plan.about}" + (f" ({len(failed)} failed)"
                                       if failed else ""))
        return 0
    if args.workers < 1:
        p.error(f"--workers must be >= 1. Received: {args.workers}")
    if args.budget < 0:
        p.error(f"--budget must be >= 0. Received: {args.budget}")
    plan = engine.PLANS[args.plan]
    path = plan.path(args.results)

    def specs(runs):
        return [s for s in plan.specs_here(runs)
                if args.only in runspec.run_key(s)]

    pool.run(specs, path, os.path.join(args.work_dir, plan.name),
               args.workers, args.budget, args.data_dir,
               log=lambda m: print(m, flush=True))
    return 0


def merge(path, here):
    """Adds the runs of the record `path` (another machine's) that `here`
    lacks, or holds short (`runspec.incomplete`: the new one replaces it,
    `records.add`), to the record `here`; a short run of `path` is refused
    with one line and not added."""
    have = {runspec.run_key(r): r for r in records.load(here)}
    new = 0
    for r in records.load(path):
        key, why = runspec.run_key(r), runspec.incomplete(r)
        if why:
            print(f"{path}: refused {key}: its record is short ({why})")
        elif key not in have or runspec.incomplete(have[key]):
            records.add(here, r)
            new += 1
    print(f"{path}: {new} new runs in {here}")


def _recheck(p, args):
    from bench.study import recheck

    if args.epochs < 1:
        p.error(f"--epochs must be >= 1. Received: {args.epochs}")
    try:
        spec, run = recheck.find(engine.PLANS[args.plan], args.key,
                                 args.results)
        rows = recheck.rerun(spec, run, args.epochs, args.work_dir)
    except (ValueError, RuntimeError) as e:
        p.exit(2, f"{p.prog} recheck: error: {e}\n")
    compared = recheck.compare(run, rows)
    print("\n".join(recheck.lines(run, compared)))
    path = recheck.record(recheck.result(args.plan, args.key, run, compared,
                                         args.epochs), args.results)
    print(f"recorded in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
