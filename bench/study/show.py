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


def accuracy(result):
    """A comparison's (`stats.compare`) final accuracy in words: the arms'
    means and their difference with its verdict and Holm mark."""
    acc = result["accuracy"]
    return (f"final accuracy {result['a']['mean']:.4f} vs "
            f"{result['b']['mean']:.4f}, difference "
            f"{interval(acc['diff'], acc['low'], acc['high'], 4)} "
            f"**{acc['verdict']}**{holm_mark(acc)}")


def reach(x, n):
    """A target's reach (`x`, of `stats.compare`) by arms of `n` seeds:
    the seeds reaching it a side and Fisher's p."""
    return (f"reached {x['a_reached']}/{n[0]} vs {x['b_reached']}/{n[1]} "
            f"(Fisher p = {x['fisher_p']:.3f})")


def updates(x):
    """A target's median updates (`x`, of `stats.compare`) a side and
    their ratio, with its verdict, Holm mark and exact rank test (`rank`)."""
    return (f"median updates {interval(*x['a_median'])} vs "
            f"{interval(*x['b_median'])}, ratio {interval(*x['ratio'], 3)} "
            f"**{x['verdict']}**{holm_mark(x)}{rank(x)}")


def pair(result, n, target=0.90):
    """A comparison (`stats.compare`) of arms of `n` seeds in words: the
    final accuracy's difference and, at `target`, reach (Fisher), median
    updates and their ratio (and the exact rank test's p, `rank`), each
    verdict with its Holm mark."""
    x = result["targets"][target]
    return f"{accuracy(result)}; {target:.2f} {reach(x, n)}, {updates(x)}"


def finding(claim, where, n, status=None, planned=None, how="", said=""):
    """One finding's line: '- **claim** (where; n = a vs b; how): said.';
    with `planned`, the arms are short of it: interim, no verdicts; with a
    `status` (no result), '- **claim** (where; n = a vs b): status.'."""
    head = f"- **{claim}** ({where}n = {n[0]} vs {n[1]}"
    if status:
        return head + f"): {status}."
    if planned:
        head += (f" of {planned} planned: interim, no verdicts until the "
                 "plan's seeds have run")
    return head + f"; {how}): {said}."
