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
