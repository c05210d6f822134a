"""How the page writes a number: a count or a share, an interval, a
target."""

import math


def number(x, digits=0):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return ("never" if not digits else "∞") if x > 0 else "−∞"
    return f"{x:,.{digits}f}"


def interval(v, lo, hi, digits=0):
    return f"{number(v, digits)} [{number(lo, digits)}, {number(hi, digits)}]"


def target(t):
    return f"{t:.2f}" if round(t, 2) == t else f"{t:.3f}"


def holm_mark(verdict):
    """' †' after a verdict (a result's dict) that a Holm correction over
    the page's verdicts would undo (`audit.audit_lines`), else ''."""
    return " †" if verdict.get("holm") is False else ""


def rank(x):
    """'; exact rank test p = 0.0079' after an updates verdict that has
    one (`stats.RANK_SEEDS` seeds a side or fewer), else ''."""
    return f"; exact rank test p = {x['rank_p']:.4f}" if "rank_p" in x else ""


def pair(result, n, target=0.90):
    """A comparison (`stats.compare`) of arms of `n` seeds in words: the
    final accuracy's difference and, at `target`, reach (Fisher), median
    updates and their ratio (and the exact rank test's p, `rank`), each
    verdict with its Holm mark."""
    acc, x = result["accuracy"], result["targets"][target]
    return (f"final accuracy {result['a']['mean']:.4f} vs "
            f"{result['b']['mean']:.4f}, difference "
            f"{interval(acc['diff'], acc['low'], acc['high'], 4)} "
            f"**{acc['verdict']}**{holm_mark(acc)}; {target:.2f} reached "
            f"{x['a_reached']}/{n[0]} vs {x['b_reached']}/{n[1]} (Fisher p = "
            f"{x['fisher_p']:.3f}), median updates {interval(*x['a_median'])}"
            f" vs {interval(*x['b_median'])}, ratio "
            f"{interval(*x['ratio'], 3)} **{x['verdict']}**{holm_mark(x)}"
            + rank(x))
