"""The statistics of the study: arms over seeds, intervals, verdicts.

An arm is one configuration run over seeds on one machine kind: each seed
gives a final accuracy and, per target, the updates it took to reach it
(None: never, counted as +infinity). Medians and their intervals are
percentile bootstraps over seeds; the accuracy difference is Welch's
interval; reach shares are compared with Fisher's exact test; at 5 seeds a
side or fewer the updates also get the exact rank test (Mann-Whitney),
whose p cannot fall below 2 / C(na + nb, na) where a bootstrap's can reach
0. A verdict word is derived from an interval, never typed.
"""

import dataclasses
import math
import warnings

import numpy as np
from scipy import stats as sps


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


def _inf(values):
    return np.array([math.inf if v is None else float(v) for v in values])


def median(values):
    """The median with None as +infinity (math.inf when it is infinite)."""
    return float(np.median(_inf(values))) if len(values) else math.nan


@dataclasses.dataclass(frozen=True)
class Arm:
    """One configuration over its seeds on one machine kind."""
    name: str
    machine: str
    seeds: tuple
    final: tuple
    updates_to: dict  # target -> tuple of updates (None: never)
    # Each run's commit ("" where its record names none, before 2026-11-29).
    commits: tuple = ()
    # Each run's processor ("" where its record names none, before
    # 2026-11-29 midday).
    processors: tuple = ()

    def __post_init__(self):
        for i, seed in enumerate(self.seeds):
            if seed in self.seeds[:i]:
                raise ValueError(f"arm `{self.name}` counts seed {seed} twice")
        if len(self.final) != len(self.seeds) or any(
                len(v) != len(self.seeds) for v in self.updates_to.values()):
            raise ValueError(f"arm `{self.name}`: {len(self.seeds)} seeds but "
                             "other lengths for its results")


def _draws(values, draws, rng):
    x = _inf(values)
    return x[rng.integers(0, len(x), size=(draws, len(x)))]


def bootstrap_median(values, draws=20000, rng_seed=0, level=0.95):
    """(median, low, high): the percentile bootstrap over seeds of the
    median: `draws` resamples of the seeds with replacement, the bounds the
    (1 -+ level) / 2 quantiles of their medians (numpy's inverted_cdf: no
    interpolation, so a bound may be +infinity). None counts as +infinity.
    One value: the bounds are (-inf, inf); none: all three nan."""
    if not len(values):
        return math.nan, math.nan, math.nan
    if len(values) == 1:
        return median(values), -math.inf, math.inf
    rng = np.random.default_rng(rng_seed)
    medians = np.median(_draws(values, draws, rng), axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2],
                         method="inverted_cdf")
    return median(values), float(lo), float(hi)


def _ratio(a, b):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isinf(a) & np.isinf(b), 1.0,
                        np.where(np.isinf(b), 0.0, a / b))


def ratio_of_medians(a_values, b_values, draws=20000, rng_seed=0, level=0.95):
    """(ratio, low, high) of median(a) / median(b) (None: +infinity): a
    percentile bootstrap with each arm resampled on its own, the bounds the
    (1 -+ level) / 2 quantiles of the drawn ratios (inverted_cdf). Infinite
    medians: only a's -> +inf, only b's -> 0, both -> 1, a tie: neither
    arm got there in that draw, so it shows no difference (dropping such
    draws would keep only those where one arm reaches, and call an arm
    reaching in 5 seeds of 10 ahead of one reaching in 1, though both
    medians are "never"). An arm of one value: bounds (0, inf); an empty
    arm: all three nan."""
    if not len(a_values) or not len(b_values):
        return math.nan, math.nan, math.nan
    point = float(_ratio(np.array([median(a_values)]),
                         np.array([median(b_values)]))[0])
    if min(len(a_values), len(b_values)) == 1:
        return point, 0.0, math.inf
    lo, hi = np.quantile(_ratio_draws(a_values, b_values, draws, rng_seed),
                         [(1 - level) / 2, (1 + level) / 2],
                         method="inverted_cdf")
    return point, float(lo), float(hi)


def _ratio_draws(a_values, b_values, draws, rng_seed):
    rng = np.random.default_rng(rng_seed)
    ma = np.median(_draws(a_values, draws, rng), axis=1)
    mb = np.median(_draws(b_values, draws, rng), axis=1)
    return _ratio(ma, mb)


def ratio_p(a_values, b_values, draws=20000, rng_seed=0):
    """The two-sided bootstrap p of median(a) / median(b) = 1, from the
    draws of `ratio_of_medians` (the same seed, the same draws): twice the
    smaller share of draws at or beyond 1 on either side, at most 1 (a tie
    at 1 counts on both sides). 1.0 when an arm has fewer than 2 values."""
    if min(len(a_values), len(b_values)) < 2:
        return 1.0
    r = _ratio_draws(a_values, b_values, draws, rng_seed)
    return float(min(1.0, 2 * min(np.mean(r >= 1), np.mean(r <= 1))))


def mann_whitney_p(a_values, b_values):
    """The two-sided p of the exact Mann-Whitney (Wilcoxon rank-sum) test
    that a and b come from one distribution. None counts as +infinity;
    tied values take their mid-ranks, and the null distribution is the
    rank sum of a over every split of the pooled values into groups of
    len(a) and len(b), each equally likely: exact with ties too (without
    them it is scipy's `mannwhitneyu(method="exact")`). p is twice the
    smaller tail at the observed rank sum, at most 1 (5 vs 5 fully apart:
    2 / C(10, 5) = 0.0079); 1.0 when an arm is empty. The splits are
    counted per rank sum by a dynamic programme over the pooled values, not
    listed, so 10 vs 10 costs what 5 vs 5 does."""
    a, b = _inf(a_values), _inf(b_values)
    if not len(a) or not len(b):
        return 1.0
    # Mid-ranks are whole or halves: doubled, they are integers.
    twice = np.rint(2 * sps.rankdata(np.concatenate([a, b]))).astype(np.int64)
    na, top = len(a), int(twice.sum())
    # counts[k, s]: the ways to pick k of the values so far with doubled
    # rank sum s.
    counts = np.zeros((na + 1, top + 1), np.float64)
    counts[0, 0] = 1.0
    for r in twice:
        counts[1:, r:] += counts[:-1, :top + 1 - r].copy()
    dist = counts[na] / counts[na].sum()
    observed = int(twice[:na].sum())
    lower, upper = dist[:observed + 1].sum(), dist[observed:].sum()
    return float(min(1.0, 2 * min(lower, upper)))


def welch_p(a, b):
    """The two-sided p of Welch's t test of mean(a) = mean(b) (1.0 with an
    arm of one value; 0 or 1 when both arms are constant)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return 1.0
    if a.var(ddof=1) + b.var(ddof=1) == 0:
        return 1.0 if a.mean() == b.mean() else 0.0
    with warnings.catch_warnings():  # Near-equal arms: scipy's precision note.
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(sps.ttest_ind(a, b, equal_var=False).pvalue)


def holm(ps, alpha=0.05):
    """Holm's step-down over the p-values `ps`: a list of bools, True where
    the hypothesis is rejected at family-wise level `alpha`."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    keep = [False] * len(ps)
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        keep[i] = True
    return keep


def reaching(values):
    """The finite values of `values` (the seeds that reached the target)."""
    return [v for v in values if v is not None]


def mean_difference(a, b, level=0.95):
    """(mean(a) - mean(b), low, high): Welch's t interval, diff -+
    t(df, (1 + level) / 2) * sqrt(va / na + vb / nb) (sample variances,
    Welch-Satterthwaite df, the quantile from scipy.stats.t); (-inf, inf)
    when an arm has one value; zero width when both arms are constant."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return diff, -math.inf, math.inf
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(sps.t.ppf((1 + level) / 2, df)) * se
    return diff, diff - half, diff + half


def mean_interval(values, level=0.95):
    """(mean, low, high): Student's t interval of the mean; (-inf, inf)
    for one value."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), -math.inf, math.inf
    half = float(sps.t.ppf((1 + level) / 2, len(x) - 1)) * x.std(ddof=1) \
        / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def fisher_one_sided(reached_a, n_a, reached_b, n_b):
    """p of Fisher's exact test that a reaches the target more often than b
    (one-sided, greater): the hypergeometric probability that a holds
    `reached_a` or more of all the seeds that reached it
    (scipy.stats.fisher_exact on [[ra, n_a - ra], [rb, n_b - rb]])."""
    table = [[reached_a, n_a - reached_a], [reached_b, n_b - reached_b]]
    return float(sps.fisher_exact(table, alternative="greater")[1])


def verdict(low, high, better="lower", null=1.0):
    """'ahead' when the whole interval lies on arm a's good side of `null`
    (`better`: 'lower' for updates, 'higher' for accuracy), 'behind' when on
    the bad side, else 'cannot tell' (an interval touching null too)."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    if math.isnan(low) or math.isnan(high):
        return "cannot tell"
    if high < null:
        return "ahead" if better == "lower" else "behind"
    if low > null:
        return "behind" if better == "lower" else "ahead"
    return "cannot tell"


def seeds_disjoint(choose_seeds, measure_seeds):
    """Raises ValueError when a seed that chose a rate also measures it."""
    both = sorted(set(choose_seeds) & set(measure_seeds))
    if both:
        raise ValueError(f"seeds {both} both chose the rate and measure it")


def same_machine_test(a, b, level=0.95, tolerance=0.002):
    """(passes, diff, low, high): one configuration's runs on two machines
    may be pooled when the (1 - 2 alpha) Welch interval of the difference
    of their final accuracies lies within +-`tolerance` (two one-sided
    tests at `level`)."""
    diff, low, high = mean_difference(a.final, b.final, 1 - 2 * (1 - level))
    return (-tolerance < low and high < tolerance), diff, low, high


def _describe(arm, targets):
    f = np.asarray(arm.final, float)
    return dict(n=len(f), mean=float(f.mean()),
                sd=float(f.std(ddof=1)) if len(f) > 1 else math.nan,
                seeds=list(arm.seeds),
                share={t: sum(v is not None for v in arm.updates_to[t])
                       / len(f) for t in targets})


# Fewer seeds than this in an arm: a percentile bootstrap over them is too
# narrow to decide, so the updates' verdict is "cannot tell". (Over n seeds
# its 95% interval of a median is about [min, max], which holds the true
# median with probability 1 - 2 / 2**n: 75%, 88%, 94% for 3, 4, 5.)
MIN_SEEDS = 5
# At most this many seeds a side, the updates also get the exact rank test
# (`mann_whitney_p`, "rank_p"): the bootstrap's p can reach 0 there, the
# rank test's not below 2 / C(na + nb, na).
RANK_SEEDS = 5


def _processors(arm):
    """{processor: [seeds]} of an arm's runs ("": their records name
    none)."""
    out = {}
    for seed, cpu in zip(arm.seeds, arm.processors or ("",) * len(arm.seeds)):
        out.setdefault(cpu, []).append(seed)
    return out


def compare(a, b, targets, draws=20000, rng_seed=0, pooled_ok=False):
    """Arm a against arm b: {"a", "b": n, mean, sd (of the final accuracy),
    seeds, share (per target, of seeds reaching it)}, "accuracy": the
    difference a - b (Welch, `mean_difference`) with low, high and verdict
    ('higher' better), "targets": {target: a_reached, b_reached, a_median,
    b_median (`bootstrap_median` triples), ratio (a / b,
    `ratio_of_medians`), rank_p (`mann_whitney_p`, with `RANK_SEEDS` seeds
    a side or fewer only), reaching_ratio (the same among the seeds of each
    arm that reach the target only: no verdict, it leaves out the seeds
    that decide most), verdict ('lower' better; "cannot tell" below
    `MIN_SEEDS` seeds in an arm), fisher_p (one direction only: that a
    reaches it more often than b)}. Arms on different machines are refused
    unless `pooled_ok`. "accuracy" and each target also give `p` (Welch's,
    the bootstrap's: `welch_p`, `ratio_p`) for a correction over the page's
    verdicts (`holm`); "commits": the commits each arm's runs ran;
    "processors": {processor: [seeds]} of each arm's runs ("": unnamed)."""
    if a.machine != b.machine and not pooled_ok:
        raise ValueError(f"arms on different machines: `{a.name}` on "
                         f"{a.machine}, `{b.name}` on {b.machine} (pool them "
                         "only after same_machine_test: pooled_ok=True)")
    diff, lo, hi = mean_difference(a.final, b.final)
    out = dict(a=_describe(a, targets), b=_describe(b, targets), accuracy=dict(
        diff=diff, low=lo, high=hi, verdict=verdict(lo, hi, "higher", 0.0),
        p=welch_p(a.final, b.final)), targets={},
        commits=dict(a=sorted(set(a.commits)), b=sorted(set(b.commits))),
        processors=dict(a=_processors(a), b=_processors(b)))
    few = max(len(a.seeds), len(b.seeds)) <= RANK_SEEDS
    for t in targets:
        ua, ub = a.updates_to[t], b.updates_to[t]
        ra = sum(v is not None for v in ua)
        rb = sum(v is not None for v in ub)
        ratio = ratio_of_medians(ua, ub, draws, rng_seed)
        out["targets"][t] = dict(
            a_reached=ra, b_reached=rb,
            reaching_ratio=ratio_of_medians(reaching(ua), reaching(ub),
                                            draws, rng_seed),
            a_median=bootstrap_median(ua, draws, rng_seed),
            b_median=bootstrap_median(ub, draws, rng_seed),
            ratio=ratio, verdict=verdict(ratio[1], ratio[2], "lower", 1.0)
            if min(len(ua), len(ub)) >= MIN_SEEDS else "cannot tell",
            p=ratio_p(ua, ub, draws, rng_seed),
            fisher_p=fisher_one_sided(ra, len(ua), rb, len(ub)))
        if few:
            out["targets"][t]["rank_p"] = mann_whitney_p(ua, ub)
    return out
