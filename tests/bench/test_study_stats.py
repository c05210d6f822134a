"""`bench/study/stats.py` against hand-computed cases: the crossing of a
target, medians with seeds that never get there, bootstrap intervals whose
answer is known, Welch's interval and Fisher's test from their formulas,
the verdict at and around its boundary, and the study's rules (no repeated
seed, no arms across machines unless pooled, rates chosen on other seeds)."""

import math

import pytest
from scipy import stats as sps

from bench.study import stats


@pytest.fixture(scope="module")
def st():
    return stats


def test_target_crossing_is_interpolated_between_evaluations(st):
    # bench/seeds.py's cases (the function it replaces).
    points = [(100, 0.80), (200, 0.86), (300, 0.91), (400, 0.89)]
    # 0.90 lies 4/5 of the way from 0.86 (200) to 0.91 (300).
    assert st.updates_to(points, 0.90) == pytest.approx(280.0)
    assert st.updates_to(points, 0.88) == pytest.approx(200 + 100 / 2.5)
    # Reached at the first evaluation: from (0 updates, accuracy 0).
    assert st.updates_to(points, 0.40) == pytest.approx(50.0)
    assert st.updates_to(points, 0.92) is None
    # Exactly at an evaluation: that evaluation; the first crossing counts.
    assert st.updates_to(points, 0.86) == pytest.approx(200.0)
    dips = [(100, 0.5), (200, 0.9), (300, 0.7), (400, 0.95)]
    assert st.updates_to(dips, 0.8) == pytest.approx(175.0)
    assert st.updates_to([], 0.5) is None


def test_a_seed_that_never_gets_there_counts_as_infinite(st):
    assert st.median([300.0, None, 100.0]) == 300.0
    assert st.median([300.0, None, 100.0, 200.0]) == 250.0
    assert st.median([None, None, 100.0]) == math.inf
    assert st.median([100.0, None]) == math.inf
    assert math.isnan(st.median([]))


def test_bootstrap_of_equal_values_is_that_value(st):
    assert st.bootstrap_median([700.0] * 6) == (700.0, 700.0, 700.0)


def test_bootstrap_interval_holds_the_sample_median_and_stays_in_range(st):
    values = [900.0, 950.0, 1000.0, 1050.0, 1100.0, 1150.0, 1200.0]
    m, lo, hi = st.bootstrap_median(values)
    assert m == 1050.0 and 900.0 <= lo < 1050.0 < hi <= 1200.0
    assert st.bootstrap_median(values) == (m, lo, hi)    # fixed rng seed
    # 3 never-reaching seeds in 7: a resampled median is infinite whenever
    # the draw holds 4 or more of them (p ~ 0.37): the upper bound is +inf.
    m, lo, hi = st.bootstrap_median([800.0, 900.0, 1000.0, 1100.0,
                                     None, None, None])
    assert m == 1100.0 and hi == math.inf and lo >= 800.0


def test_one_seed_gives_an_infinite_interval(st):
    assert st.bootstrap_median([700.0]) == (700.0, -math.inf, math.inf)
    ratio, lo, hi = st.ratio_of_medians([500.0], [1000.0] * 6)
    assert (ratio, lo, hi) == (0.5, 0.0, math.inf)
    assert st.verdict(lo, hi, "lower", 1.0) == "cannot tell"


def test_separated_arms_are_ahead_and_overlapping_ones_cannot_be_told(st):
    fast = [500.0 + 10 * i for i in range(10)]
    slow = [1000.0 + 10 * i for i in range(10)]
    ratio, lo, hi = st.ratio_of_medians(fast, slow)
    assert ratio == pytest.approx(545 / 1045)
    # Every resampled median of `fast` lies in [500, 590], of `slow` in
    # [1,000, 1,090]: the ratio in [500/1,090, 590/1,000].
    assert 500 / 1090 <= lo <= ratio <= hi <= 590 / 1000
    assert st.verdict(lo, hi, "lower", 1.0) == "ahead"
    assert st.verdict(*st.ratio_of_medians(slow, fast)[1:]) == "behind"
    mixed = [500.0 + 100 * i for i in range(10)]
    other = [550.0 + 100 * i for i in range(10)]
    _, lo, hi = st.ratio_of_medians(mixed, other)
    assert lo < 1 < hi and st.verdict(lo, hi) == "cannot tell"


def test_ratio_when_an_arm_never_gets_there(st):
    # Only b never reaches it: a ratio of 0, a ahead; only a: +inf.
    assert st.ratio_of_medians([500.0] * 5, [None] * 5) == (0.0, 0.0, 0.0)
    assert st.ratio_of_medians([None] * 5, [500.0] * 5) == (
        math.inf, math.inf, math.inf)
    # Both never: a tie in every draw, which decides nothing.
    assert st.ratio_of_medians([None] * 3, [None] * 3) == (1.0, 1.0, 1.0)
    assert st.verdict(1.0, 1.0) == "cannot tell"


def test_draws_where_both_arms_never_get_there_are_ties_not_dropped(st):
    # 5 of 10 seeds reach it against 1 of 10: both medians are "never".
    a = [500.0 + 10 * i for i in range(5)] + [None] * 5
    b = [600.0] + [None] * 9
    ratio, lo, hi = st.ratio_of_medians(a, b)
    # a's resampled median is finite only when 6 or more of its 10 draws
    # reach (P = 0.377); b's practically never is (>= 6 of 10 at 0.1): the
    # draws are 0 (a finite) or 1 (both never, a tie), about 38% / 62%.
    assert ratio == 1.0 and (lo, hi) == (0.0, 1.0)
    assert st.verdict(lo, hi, "lower", 1.0) == "cannot tell"
    # Dropping the tied draws (the old rule) left only the 0s: "ahead".
    assert st.verdict(0.0, 0.0, "lower", 1.0) == "ahead"
    at = st.compare(_arm(st, "a", [0.9] * 10, a), _arm(st, "b", [0.9] * 10, b),
                    (0.9,))["targets"][0.9]
    assert at["verdict"] == "cannot tell" and (at["a_reached"],
                                               at["b_reached"]) == (5, 1)


def test_the_ratio_among_reaching_seeds_leaves_out_the_others(st):
    a = [500.0, 520.0, 540.0, 560.0, 580.0, 600.0]
    b = [1000.0, 1100.0, 1200.0, None, None, None]
    at = st.compare(_arm(st, "a", [0.9] * 6, a), _arm(st, "b", [0.9] * 6, b),
                    (0.9,))["targets"][0.9]
    # All of a's against b's three: medians 550 and 1,100.
    assert at["reaching_ratio"] == st.ratio_of_medians(a, b[:3])
    assert at["reaching_ratio"][0] == pytest.approx(550 / 1100)
    assert at["ratio"][0] == pytest.approx(550 / math.inf)
    none = st.compare(_arm(st, "a", [0.9] * 5, [None] * 5),
                      _arm(st, "b", [0.9] * 5, b[:5]), (0.9,))
    assert all(math.isnan(x) for x in none["targets"][0.9]["reaching_ratio"])


def test_welch_interval_matches_its_formula(st):
    a, b = [0.90, 0.91, 0.905], [0.895, 0.90, 0.898]
    # By hand: means 0.905 and 0.8976667; va/na = 2.5e-5/3, vb/nb =
    # (3.8e-5/3)/2/3; df = 2.9522; t(0.975, df) = 3.2118; se = 0.0032318.
    ma, mb = sum(a) / 3, sum(b) / 3
    va = sum((x - ma) ** 2 for x in a) / 2 / 3
    vb = sum((x - mb) ** 2 for x in b) / 2 / 3
    assert (va, vb) == pytest.approx((2.5e-5 / 3, 3.8e-5 / 18), rel=1e-9)
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    half = sps.t.ppf(0.975, df) * math.sqrt(va + vb)
    diff, lo, hi = st.mean_difference(a, b)
    assert diff == pytest.approx(0.022 / 3, abs=1e-12)
    assert (lo, hi) == pytest.approx((ma - mb - half, ma - mb + half),
                                     abs=1e-12)
    assert (lo, hi) == pytest.approx((-0.0030465, 0.0177131), abs=1e-6)
    assert st.verdict(lo, hi, "higher", 0.0) == "cannot tell"
    # One seed decides nothing.
    assert st.mean_difference([0.9], b)[1:] == (-math.inf, math.inf)


def test_fisher_one_sided_is_the_hypergeometric_tail(st):
    # 10 of 10 against 3 of 5: 13 successes in 15; a holds all 10 of its
    # seeds' with probability C(13, 10) C(2, 0) / C(15, 10) = 286 / 3,003.
    assert st.fisher_one_sided(10, 10, 3, 5) == pytest.approx(286 / 3003)
    assert 286 / 3003 == pytest.approx(0.0952381, abs=1e-7)
    assert st.fisher_one_sided(3, 5, 10, 10) == pytest.approx(1.0)
    # 4 of 5 against 1 of 5: P(a holds >= 4 of the 5 successes).
    tail = sum(math.comb(5, k) * math.comb(5, 5 - k) for k in (4, 5)) \
        / math.comb(10, 5)
    assert tail == pytest.approx(26 / 252)
    assert st.fisher_one_sided(4, 5, 1, 5) == pytest.approx(tail)


@pytest.mark.parametrize("low, high, better, null, word", [
    (0.5, 0.9, "lower", 1.0, "ahead"),
    (1.1, 1.5, "lower", 1.0, "behind"),
    (0.9, 1.0, "lower", 1.0, "cannot tell"),   # touching null
    (1.0, 1.2, "lower", 1.0, "cannot tell"),   # touching null
    (0.002, 0.01, "higher", 0.0, "ahead"),
    (-0.01, -0.002, "higher", 0.0, "behind"),
    (0.0, 0.01, "higher", 0.0, "cannot tell"),  # touching null
    (-0.01, 0.01, "higher", 0.0, "cannot tell"),
    (0.0, math.inf, "lower", 1.0, "cannot tell"),
    (math.nan, math.nan, "lower", 1.0, "cannot tell"),
])
def test_the_verdict_follows_from_the_interval(st, low, high, better, null,
                                               word):
    assert st.verdict(low, high, better, null) == word


def test_the_verdict_needs_a_direction(st):
    with pytest.raises(ValueError, match="better"):
        st.verdict(0.5, 0.9, "smaller", 1.0)


def _arm(st, name, finals, updates, machine="CPU VM / JAX", seeds=None):
    seeds = tuple(range(100, 100 + len(finals))) if seeds is None else seeds
    return st.Arm(name, machine, seeds, tuple(finals), {0.9: tuple(updates)})


def test_compare_refuses_arms_on_two_machines_and_few_seeds_decide_nothing(
        st):
    a = _arm(st, "grown", [0.91] * 10, [500.0 + 10 * i for i in range(10)])
    b = _arm(st, "fixed", [0.90] * 10, [1000.0 + 10 * i for i in range(10)],
             machine="H200 / JAX")
    with pytest.raises(ValueError, match="different machines"):
        st.compare(a, b, (0.9,))
    assert st.compare(a, b, (0.9,), pooled_ok=True)["targets"][0.9][
        "verdict"] == "ahead"
    b = _arm(st, "fixed", [0.90, 0.905, 0.895] * 3 + [0.9],
             [1000.0 + 10 * i for i in range(9)] + [None])
    result = st.compare(a, b, (0.9,))
    assert result["a"]["n"] == 10 and result["b"]["share"] == {0.9: 0.9}
    assert result["accuracy"]["verdict"] == "ahead"
    at = result["targets"][0.9]
    assert at["verdict"] == "ahead" and (at["a_reached"], at["b_reached"]) \
        == (10, 9)
    assert at["fisher_p"] == pytest.approx(0.5)     # C(19,9) / C(20,10)
    assert at["a_median"] == st.bootstrap_median(a.updates_to[0.9])
    few = st.compare(_arm(st, "a", [0.91] * 3, [500.0] * 3),
                     _arm(st, "b", [0.90] * 3, [1000.0] * 3), (0.9,))
    assert few["targets"][0.9]["verdict"] == "cannot tell"
    one = st.compare(_arm(st, "a", [0.91], [500.0]),
                     _arm(st, "b", [0.90], [1000.0]), (0.9,))
    assert one["accuracy"]["verdict"] == "cannot tell"
    assert one["targets"][0.9]["ratio"] == (0.5, 0.0, math.inf)


def test_an_arm_refuses_a_repeated_seed_and_uneven_results(st):
    with pytest.raises(ValueError, match="fixed 128.*seed 3 twice"):
        _arm(st, "fixed 128", [0.9, 0.91], [1.0, 2.0], seeds=(3, 3))
    with pytest.raises(ValueError, match="2 seeds"):
        _arm(st, "fixed 128", [0.9, 0.91], [1.0], seeds=(3, 4))


def test_pooling_needs_the_difference_within_the_tolerance(st):
    same = [0.905, 0.907, 0.906, 0.908, 0.904, 0.906] * 2
    a, b = _arm(st, "cpu", same, [1.0] * 12), _arm(st, "gpu", same, [1.0] * 12)
    passes, diff, lo, hi = st.same_machine_test(a, b)
    # TOST at 0.95: the 90% Welch interval.
    assert passes and (diff, lo, hi) == st.mean_difference(same, same, 0.90)
    shifted = _arm(st, "gpu", [x + 0.004 for x in same], [1.0] * 12)
    assert not st.same_machine_test(a, shifted)[0]
    # No difference seen but too few, too noisy runs: not shown equivalent.
    noisy = _arm(st, "gpu", [0.900, 0.912], [1.0] * 2)
    assert st.same_machine_test(a, noisy)[1] == pytest.approx(0.0, abs=1e-9)
    assert not st.same_machine_test(a, noisy)[0]


def test_a_rate_is_measured_on_other_seeds_than_chose_it(st):
    st.seeds_disjoint(range(10), range(100, 110))
    with pytest.raises(ValueError, match=r"\[0\]"):
        st.seeds_disjoint([0, 1], [0, 100])


def test_the_exact_rank_test_is_scipys_without_ties_and_closed_form_with(st):
    # 5 vs 5 fully apart: one split of 252 as extreme on each side.
    assert st.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == \
        pytest.approx(2 / 252)
    assert st.mann_whitney_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == \
        pytest.approx(2 / 252)
    # 3 vs 3 apart: 2 / C(6, 3) = 0.1, never below it.
    assert st.mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    rng = __import__("numpy").random.default_rng(0)
    for na, nb in ((5, 5), (4, 5), (3, 7), (10, 10)):
        a, b = rng.normal(size=na), rng.normal(0.8, size=nb)
        assert st.mann_whitney_p(a, b) == pytest.approx(
            sps.mannwhitneyu(a, b, method="exact").pvalue, rel=1e-9)
    # Seeds that never reach count as +infinity and tie with each other:
    # a = (1, 2, inf), b = (inf, inf, inf): mid-rank 4.5 for the four
    # infinities (ranks 3-6); a's rank sum 1 + 2 + 4.5 = 7.5 is the least
    # of the C(6, 3) = 20 splits' (those holding both 1 and 2: 4 of them),
    # so p = 2 * 4 / 20.
    assert st.mann_whitney_p([1, 2, None], [None] * 3) == pytest.approx(0.4)
    # Everything tied: no evidence either way.
    assert st.mann_whitney_p([None] * 5, [None] * 5) == 1.0
    assert st.mann_whitney_p([], [1.0]) == 1.0
