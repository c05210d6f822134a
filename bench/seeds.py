"""A configuration over its seeds: what every study's report reads.

A study's runs differ by seed; `aggregate` groups them by a key (everything
but the seed) and gives each group its seeds, the final accuracy of each
and their mean and sample standard deviation (none for one seed: one seed
decides nothing), and, per target accuracy, the updates each seed took to
reach it (`updates_to`: linear interpolation between the evaluations around
the crossing), their median with a seed that never got there counted as
infinite (`median_updates`), and how many got there.
"""

import math
import statistics


def updates_to(points, target):
    """Updates at which the accuracy first reaches `target`: linear
    interpolation between the first point at or above it and the one before
    (or (0 updates, accuracy 0) before the first); None if never.
    `points`: [(updates, accuracy), ...] in order."""
    prev_u, prev_a = 0.0, 0.0
    for u, a in points:
        if a >= target:
            frac = (target - prev_a) / (a - prev_a) if a > prev_a else 1.0
            return prev_u + frac * (u - prev_u)
        prev_u, prev_a = u, a
    return None


def median_updates(values):
    """Median of updates-to-target over seeds, a seed that never got there
    (None) counted as infinite; None when the median is infinite or there
    are no seeds."""
    ranked = sorted(math.inf if v is None else v for v in values)
    n = len(ranked)
    if not n:
        return None
    mid = ranked[n // 2] if n % 2 else (ranked[n // 2 - 1] + ranked[n // 2]) / 2
    return None if math.isinf(mid) else mid


def aggregate(runs, key, targets, reached):
    """{key(run): summary} over the seeds of each configuration.

    `reached(run, target)` gives a run's updates to `target` (None: never).
    A summary holds `n`, `seeds`, `final` (each seed's), `mean`, `sd`,
    `updates_to` ({target: each seed's}), `median_to` and `reached`
    ({target: seeds that got there}).
    """
    groups = {}
    for r in runs:
        groups.setdefault(key(r), []).append(r)
    out = {}
    for k, group in groups.items():
        group = sorted(group, key=lambda r: r["seed"])
        finals = [r["val_accuracy"] for r in group]
        to = {t: [reached(r, t) for r in group] for t in targets}
        out[k] = dict(
            n=len(group), seeds=[r["seed"] for r in group], final=finals,
            mean=statistics.fmean(finals),
            sd=statistics.stdev(finals) if len(finals) > 1 else None,
            updates_to=to,
            median_to={t: median_updates(v) for t, v in to.items()},
            reached={t: sum(v is not None for v in to[t]) for t in targets})
    return out


def describe(s, digits=4):
    """`0.9049 ± 0.0030 (n=10)`, or `0.9094 (one seed)`."""
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f} (one seed)"
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f} (n={s['n']})"
