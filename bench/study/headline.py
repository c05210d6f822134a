"""The findings at a glance (issue 74): one table, a row a claim, with its
machine kind and backend, n a side, the 95% interval, the verdict and †,
generated from the report's findings (`table_lines`). `python -m
bench.study report` writes it at the top of the report and, between its
markers, at the top of the study's page (`embed`, `PAGE`): the page quotes
it, never retypes it."""

import os

import bench
from bench.study import plans
from bench.study import show
from bench.study.depth import DEPTH_NAME
from bench.study.depth import OPTIMIZER_NAMES
from bench.study.findings import FLOOR
from bench.study.momentum import NAMES
from keras_largebatch._shared import atomic_write

PAGE = os.path.join(bench.ROOT, "docs", "large-batch-study.md")
BEGIN = "<!-- findings table: written by `python -m bench.study report` -->"
END = "<!-- end of the findings table -->"
TARGET = 0.90


def _row(claim, kind, n, interval="–", verdict="", mark=""):
    return f"| {claim} | {kind} | {n} | {interval} | {verdict} | {mark} |"


def _mark(verdict):
    return "†" if verdict.get("holm") is False else ""


def _rows(claim, kind, n, result, status, planned=None):
    """A comparison's rows: one with its status where it has no result,
    else its final accuracy (a - b, Welch) and updates to `TARGET` (a / b,
    the bootstrap; the rank test's p beside it where it has one)."""
    sides = f"{n[0]} / {n[1]}"
    if status:
        return [_row(claim, kind, sides, verdict=status.replace(
            "not run yet (n = 0)", "not run yet"))]
    acc, x = result["accuracy"], result["targets"][TARGET]
    shy = planned and min(n) < planned
    word = (lambda v: f"interim ({min(n)} of {planned})" if shy else v)
    return [
        _row(f"{claim}: final accuracy", kind, sides, show.interval(
            acc["diff"], acc["low"], acc["high"], 4), word(acc["verdict"]),
            _mark(acc)),
        _row(f"{claim}: updates to {TARGET:.2f}", kind, sides,
             show.interval(*x["ratio"], 3) + (
                 f"; rank p {x['rank_p']:.4f}" if "rank_p" in x else ""),
             word(x["verdict"]), _mark(x))]


def _nesterov(found):
    if found["nesterov_at"] is None:
        return "Nesterov SGD"
    warmup, rate = found["nesterov_at"]
    return (f"Nesterov SGD ({rate:g}, warmup {warmup:.3g}"
            + ("" if found["bracketed"] else ", unbracketed") + ")")


def table_lines(baselines, floors, depth, momentum, verdicts):
    """The findings table: the defaults against each baseline (`baselines`,
    `baselines.baseline_findings`) and the floor (`floors`,
    `findings.floor_findings`); LARS at depth (`depth`,
    `depth.depth_findings`); each machine kind's momentum comparison
    (`momentum`, `momentum.momentum_all`); then what the columns mean, with
    the number of verdicts the † is counted over (`verdicts`)."""
    lines = ["| claim | kind / backend | n a side | 95% interval | verdict | † |",
             "|---|---|---|---|---|---|"]
    for f in baselines:
        lines += _rows(f"Defaults vs {f['name'].split(' (')[0]}",
                       f["machine"], f["n"], f["result"], f["status"],
                       f["planned"][1])
    for f in floors:
        lines.append(_row(f"Defaults' final accuracy vs the floor of {FLOOR}",
                          f["machine"], str(f["n"]), show.interval(
                              f["mean"], f["low"], f["high"], 4),
                          f["verdict"]))
    for p in depth["pairs"]:
        a, b = OPTIMIZER_NAMES[p["a"]], OPTIMIZER_NAMES[p["b"]]
        result = p["result"]
        row = _rows(f"{a} vs {b}{' (as first run)' if b == 'SGD' else ''}, "
                    f"{DEPTH_NAME} at {depth['batch']:,}",
                    depth["machine"] or "–", p["n"], result, p["status"])
        lines += row[:1]  # At 3 seeds an arm the updates decide nothing.
    for found in momentum:
        for p in found["pairs"]:
            b = _nesterov(found) if p["b"] == "nesterov" else NAMES[p["b"]]
            if p["b"] == "grid":
                b += (f" ({found['grid_at'][1]:g}, warmup "
                      f"{found['grid_at'][0]:.3g})")
            a = NAMES[p["a"]] + (f" ({found['nesterov_at'][1]:g}, warmup "
                                 f"{found['nesterov_at'][0]:.3g})"
                                 if p["a"] == "nesterov"
                                 and found["bracketed"] else "")
            lines += _rows(f"{a} vs {b}, {DEPTH_NAME} at 4,096",
                           found["machine"] or "–", p["n"], p["result"],
                           p["status"], len(plans.MOMENTUM_MEASURE))
    return lines + [
        "", "Accuracy: the difference of mean final accuracies, first arm "
        "minus second (Welch); updates: the ratio of median updates to "
        f"{TARGET:.2f}, first over second, below 1 fewer (a percentile "
        "bootstrap; a seed that never gets there counts as infinite), with "
        "the exact rank test's p (Mann–Whitney) at 5 seeds a side or fewer. "
        "ahead / behind: the whole interval on one side of no difference; "
        "updates need 5 seeds an arm; interim: an arm short of its plan's "
        "seeds; unbracketed: Nesterov SGD at its grid's best, whose warmup "
        f"is the grid's longest and not yet bracketed. †: a Holm correction over the report's {verdicts} "
        "verdicts undoes it (at few seeds it counts the rank test's p too): "
        "it stands on its own interval only."]


def embed(lines, page=PAGE):
    """Writes `lines` into `page` between `BEGIN` and `END`, the rest of
    the page as it is; a ValueError naming the page where it lacks them."""
    with open(page) as f:
        text = f.read()
    if BEGIN not in text or END not in text.split(BEGIN, 1)[1]:
        raise ValueError(f"{page} has no findings table to write: it needs "
                         f"the lines {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    atomic_write(page, head + BEGIN + "\n" + "\n".join(lines) + "\n" + END
                 + tail)
