"""What the page's verdicts rest on: how many it computes, which of its
"ahead" / "behind" would not survive a Holm correction over all of them
(an updates verdict at `stats.RANK_SEEDS` seeds a side or fewer survives
only where its exact rank test does too: issue 74), and which comparisons
set runs of different commits or processors against each other (issue
60)."""

from bench.core import provenance
from bench.study import show
from bench.study import stats

ALPHA = 0.05


def verdicts(baselines, pairs, found):
    """[(label, verdict, commits, processors)] of every verdict the page's comparisons
    derive from an interval (`baselines`, the depth and momentum `pairs`,
    the earlier comparisons `found`): final accuracy (Welch) and, with
    `stats.MIN_SEEDS` seeds an arm, updates to each target (bootstrap); not
    an interim arm's, nor one a measuring seed chose the rate of. `verdict`
    is the result's own dict ("verdict", "p"), which `audit_lines` marks;
    `commits` the comparison's {"a": [...], "b": [...]}, `processors` its
    {"a": {processor: [seeds]}, "b": ...}."""
    out = []

    def add(claim, result):
        n = (result["a"]["n"], result["b"]["n"])
        acc, commits = result["accuracy"], result["commits"]
        cpus = result.get("processors", {"a": {}, "b": {}})
        out.append((f"{claim}: final accuracy", acc, commits, cpus))
        if min(n) >= stats.MIN_SEEDS:
            for t, x in result["targets"].items():
                out.append((f"{claim}: updates to {show.target(t)}", x,
                            commits, cpus))

    for f in baselines:
        if f["result"] and not f["interim"]:
            add(f"the defaults against {f['name']}", f["result"])
    for f in pairs:
        if f["result"] and not f["status"] and not f.get("interim"):
            add(f["claim"], f["result"])
    for f in found:
        if not f["result"]["accuracy"]["verdict"].startswith("cannot tell ("):
            add(f"{f['claim']} ({f['machine']})", f["result"])
    return out


def holm_p(verdict):
    """The p a verdict enters the Holm correction with: its test's
    (`stats.compare`'s "p"), or where it also has the exact rank test's
    ("rank_p": updates at few seeds) the larger of the two, so that it
    survives only where both would."""
    return max(verdict["p"], verdict.get("rank_p", 0.0))


def audit_lines(entries, alpha=ALPHA):
    """The count of `entries` (`verdicts`), the decided ones a Holm
    correction over all of them at family-wise `alpha` would undo (each
    such verdict's dict gets `holm: False`, which `show.holm_mark` shows
    where the page states it; a surviving one `holm: True`; `holm_p`), and
    the comparisons whose arms ran different commits or processors."""
    keep = stats.holm([holm_p(e[1]) for e in entries], alpha)
    decided = [(e, k) for e, k in zip(entries, keep)
               if e[1]["verdict"] in ("ahead", "behind")]
    for e, k in decided:
        e[1]["holm"] = k
    lost = [e for e, k in decided if not k]
    line = (f"- **How many verdicts:** the comparisons of this page compute "
            f"{len(entries)} verdicts from intervals (final accuracy: "
            f"Welch; updates to a target: the bootstrap, from "
            f"{stats.MIN_SEEDS} seeds an arm, and at {stats.RANK_SEEDS} a "
            "side or fewer the larger of its p and the exact rank test's "
            "(Mann–Whitney); the floor's line is not "
            f"counted); {len(decided)} say ahead or behind. Under a Holm "
            f"correction over all {len(entries)} at a family-wise "
            f"{alpha:.0%}, ")
    if not lost:
        line += "every one of them survives."
    else:
        line += (f"{len(lost)} would not survive (marked † where the page "
                 "states them; each stands on its own 95% interval only): "
                 + "; ".join(f"{label} ({v['verdict']}, p = "
                             f"{holm_p(v):.3g}"
                             + (", the rank test's" if "rank_p" in v
                                and v["rank_p"] > v["p"] else "") + ")"
                             for label, v, *_ in lost) + ".")
    lines = [line]
    mixed, unnamed = [], 0
    for label, _, commits, *_ in entries:
        if not label.endswith(": final accuracy"):
            continue
        named = set(commits["a"] + commits["b"])
        if "" in named:
            unnamed += 1
        if len(named - {""}) > 1:
            mixed.append(label.removesuffix(": final accuracy"))
    compared = sum(e[0].endswith(": final accuracy") for e in entries)
    lines.append(
        f"- **Code:** of the {compared} comparisons, {unnamed} hold runs whose records name no commit "
        "(recorded before 2026-11-29, when records began to stamp theirs)"
        + (f"; the arms of {len(mixed)} ran different commits: "
           + "; ".join(mixed) if mixed else
           "; none sets runs of different named commits against each "
           "other") + ".")
    return lines + [_processor_line(entries, compared)]


def _seeds(seeds):
    """'seeds 101–107' for a run of consecutive seeds, else 'seeds 100,
    104' ('seed 100' for one)."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds[-1] - seeds[0] == len(seeds) - 1:
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(
        map(str, seeds))


def _processor_line(entries, compared):
    """Which comparisons' arms ran on more than one processor (as the
    records stamp it, since 2026-11-29 midday), each arm's seeds per
    processor."""
    moved = []
    for label, _, _, processors in entries:
        if not label.endswith(": final accuracy"):
            continue
        if len({cpu for side in processors.values() for cpu in side
                if cpu}) < 2:
            continue
        moved.append(label.removesuffix(": final accuracy") + " (" + "; ".join(
            f"arm {side}: " + ", ".join(
                f"{_seeds(seeds)} on {cpu or 'a processor not named'}"
                for cpu, seeds in processors[side].items())
            for side in ("a", "b")) + ")")
    return (f"- **Processors:** records name their processor (model and a "
            "digest of its flags) since 2026-11-29 midday; of the "
            f"{compared} comparisons, "
            + (f"the arms of {len(moved)} ran on more than one: "
               + "; ".join(moved) if moved else
               "none ran its arms on more than one named processor") + ".")


def recheck_lines(rechecks):
    """One line on `rechecks.json` (`recheck.record`): the recorded runs
    whose first epochs ran again at later code, each with both commits and
    whether every value came out identical."""
    if not rechecks:
        return []

    def commit(c):
        return c[:7] if c else "no commit"

    each = []
    for r in rechecks:
        worst = max(r["compared"], key=lambda c: abs(c["difference"]))
        recorded = r["recorded"]
        outcome = ("identical" if r["identical"] else
                   f"differs, {worst['field']} of epoch {worst['epoch']} by "
                   f"{worst['difference']:+.3g}; recorded "
                   f"{(recorded.get('machine') or '?').rsplit(', ', 1)[-1]} "
                   + ("on the same processor and boot"
                      if recorded.get("boot") == r.get("boot")
                      and recorded.get("boot") else
                      "on another boot" if recorded.get("boot") else
                      "before records named their processor"))
        epochs = f"{r['epochs']} epoch" + ("s" if r["epochs"] != 1 else "")
        kind = provenance.machine_kind(r.get("machine"))
        if kind != provenance.machine_kind(recorded.get("machine")):
            epochs += f", rerun on {kind}"
        each.append(f"`{r['key']}` ({r['plan']}, {epochs}, "
                    f"{commit(r['recorded']['commit'])} -> "
                    f"{commit(r['code']['commit'])}): {outcome}")
    same = sum(r["identical"] for r in rechecks)
    return [f"- **Rechecks** (`python -m bench.study recheck`): "
            f"{len(rechecks)} recorded runs ran their first epochs again at "
            f"later code; {same} came out "
            "identical, epoch by epoch: " + "; ".join(each) + "."]
