"""The command's defaults against each baseline of issue 51, the decisive
fixed arm's and the plan `baselines`' (`BASELINE_ARMS`): final accuracy and,
per target, the ratio of median updates, with intervals and verdicts; an
arm without runs reads "not run yet", one with fewer seeds than its plan
"interim": its intervals so far, no verdicts. The 36-epoch arm also says
whether its first seeds change a verdict of the 24-epoch arm's
(`long_rule`), which decides whether it runs 5 seeds or 10."""

from bench.study import engine
from bench.study import plans
from bench.study import show
from bench.study import stats
from bench.study.selection import TARGETS
from bench.study.selection import arm
from bench.study.selection import interim
from bench.study.selection import shortfall
from keras_largebatch.adaptive_batch import defaults

# The defaults against each baseline of issue 51 (the decisive fixed arm and
# the plan `baselines`): (name, selection, where its rate or schedule came
# from), on the decisive seeds and their machine kind only.
DEFAULTS = dict(kind="grown", variant="default", rate=0.4, epochs=24,
                optimizer="sgd")
BASELINE_MACHINE = "CPU VM / TensorFlow"
SEEDS = plans.DECISIVE_SEEDS
RAMP = "the fixed ramp ({}, 0.4 x the batch / 128)".format(", then ".join(
    f"{b:,} from epoch {e}" for e, b in engine.batch_steps(
        plans.RAMP_SCHEDULE)))

# The defaults' start (`adaptive_batch.defaults`) from the plans' small
# batch, and its rate (linear in the batch): where a ramp written without
# the noise scale starts there, it separates the start from the measurement.
START = defaults.START_MULTIPLE * plans.SMALL_BATCH
START_RATE = DEFAULTS["rate"] * defaults.START_MULTIPLE


def _unpeeked(variant, name, why):
    """The arm of `plans.UNPEEKED_RAMPS[variant]`: (name, selection, why)."""
    steps = ", ".join(f"{b:,} from epoch {e}" for e, b in engine.batch_steps(
        plans.UNPEEKED_RAMPS[variant]))
    return (f"the {name} written without the noise scale ({steps}, 0.4 "
            "x the batch / 128)", dict(kind="ramp", variant=variant, rate=0.4,
                                       epochs=24, optimizer="sgd"), why)


BASELINE_ARMS = (
    ("fixed 1,024 at 0.8", dict(kind="fixed", batch=1024, rate=0.8, epochs=24,
                                optimizer="sgd"),
     "the H200 / JAX front's best for 0.90; its rate chosen there on seed 0, "
     "one seed a rate"),
    (RAMP, dict(kind="ramp", variant=None, rate=0.4, epochs=24,
                optimizer="sgd"),
     "the schedule the grown defaults at 0.4 followed on seeds 0-4 (CPU VM / "
     "JAX), written in the plan before it ran"),
    ("fixed 512 at 1.6", dict(kind="fixed", batch=512, rate=1.6, epochs=24,
                              optimizer="sgd"),
     "the CPU VM / JAX front's best for 0.90 and 0.905, seeds 0-2"),
    ("fixed 1,024 at 0.8 over 36 epochs", dict(
        kind="fixed", batch=1024, rate=0.8, epochs=36, optimizer="sgd"),
     "the decisive arm's rate; its decay ends after the grown runs'"),
    *(_unpeeked(variant, name, why) for variant, name, why in (
        ("linear_ramp", "linear ramp",
         "Megatron-LM's `--rampup-batch-size` shape, 128 to 1,024 over the "
         "first quarter of the samples, fixed in the plan before any run"),
        ("doubling", "doubling ramp",
         "128 doubled at epochs 2, 4 and 6, fixed in the plan before any "
         "run"),
        ("start512", f"ramp from {START}",
         f"the defaults' start ({START} from the first update, at "
         f"{START_RATE:g}) with no measurement, 1,024 from a quarter of the "
         "samples; fixed in the plan before any run (issue 74)"))),
)


def ramp_start(sel):
    """How a ramp arm (`BASELINE_ARMS`' selection) starts: "peeked" (its
    schedule read from the grown runs), "start" (written without the noise
    scale, from the defaults' start, `START`), or "small" (written without
    it, from below that start)."""
    if sel["variant"] is None:
        return "peeked"
    first = engine.batch_steps(plans.UNPEEKED_RAMPS[sel["variant"]])[0][1]
    return "start" if first == START else "small"


def ramp_sentence(result, start):
    """What the defaults against a ramp say, from their verdicts and how
    the ramp starts (`ramp_start`). Without a verdict either way the two
    could not be told apart (no equivalence is shown): for a "peeked" ramp
    that replaying the noise scale's output works; for one from the
    defaults' start ("start") that the updates the defaults save over the
    ramps from 128 are not shown to come from the measurement; for one from
    128 ("small") that the grown batch added nothing these intervals show.
    Where the defaults are ahead: of a ramp from their start, the
    measurement adds something beyond the start there; of one from 128,
    these arms do not tell the start's share from the measurement's."""
    verdicts = _verdicts(result)
    ahead = [name for name, word in verdicts if word == "ahead"]
    behind = [name for name, word in verdicts if word == "behind"]
    shared = (f"this ramp shares the defaults' start ({START:,} from the "
              f"first update, at {START_RATE:g}) and measures nothing")
    if not ahead and not behind:
        head = ("The grown batch and this ramp could not be told apart "
                "(no verdict either way, on final accuracy or at any "
                "target; not an equivalence test): ")
        return head + {
            "peeked": "its schedule was read from the grown runs of seeds "
                      "0-4, so this shows that replaying the noise scale's "
                      "output works, not that a schedule written without it "
                      "would.",
            "start": shared + ", so the updates the grown batch saves over "
                     "the ramps from 128 are not shown to come from the "
                     "measurement: the start may account for them.",
            "small": "written without the noise scale, from 128, it did not "
                     "fall behind where these intervals could see, so the "
                     "grown batch (its start and its measurement together) "
                     "added nothing they show over it."}[start]
    parts = []
    if ahead:
        parts.append("the grown batch is ahead of this ramp on "
                     + ", ".join(ahead) + {
                         "peeked": "",
                         "start": ": " + shared + ", so there the "
                                  "measurement adds something beyond the "
                                  "start",
                         "small": f": this ramp starts at "
                                  f"{plans.SMALL_BATCH} where the defaults "
                                  f"start at {START:,} and then follow the "
                                  "measured B_simple, so these arms do not "
                                  "tell the start's share from the "
                                  "measurement's (the ramp from "
                                  f"{START:,} does)"}[start])
    if behind:
        parts.append("this ramp is ahead of the grown batch on "
                     + ", ".join(behind))
    said = "; ".join(parts)
    return said[0].upper() + said[1:] + "."


def _verdicts(result):
    return [("final accuracy", result["accuracy"]["verdict"])] + [
        (show.target(t), result["targets"][t]["verdict"]) for t in TARGETS]


def long_rule(here, a, at_24, sel):
    """Issue 51's rule for the 36-epoch arm: its first seeds
    (`plans.LONG_FIRST_SEEDS`) against the defaults, verdict by verdict,
    against `at_24` (the defaults against the 24-epoch arm, `stats.compare`):
    a sentence saying which verdicts change and so whether the arm runs 5
    seeds or 10; None until those seeds and the 24-epoch arm's (`at_24`
    None while it is interim) have run."""
    seeds = plans.LONG_FIRST_SEEDS
    first = arm(here, "first", seeds=seeds, **sel)
    if len(first.seeds) < len(seeds) or at_24 is None:
        return None
    changed = [f"{name} ({old} at 24 epochs, {new} at 36)"
               for (name, old), (_, new) in zip(
                   _verdicts(at_24), _verdicts(stats.compare(a, first, TARGETS)))
               if old != new]
    head = (f"On seeds {seeds[0]}–{seeds[-1]} against the 24-epoch arm's "
            "verdicts, ")
    if not changed:
        return head + f"none changes: the rule keeps {len(seeds)} seeds."
    return (head + "changed: " + ", ".join(changed) + f": the rule runs "
            f"{len(SEEDS)} seeds.")


def planned(sel):
    """How many seeds the plans `decisive`, `baselines` and `ramps` give
    the arm `sel` selects (the decisive defaults' too)."""
    return len({s["seed"] for name in ("decisive", "baselines", "ramps")
                for s in engine.PLANS[name].specs
                if all(s.get(k) == v for k, v in sel.items())})


def baseline_findings(runs):
    """The defaults against each of `BASELINE_ARMS` on `BASELINE_MACHINE`
    and the decisive seeds: [{name, machine, chosen_on, n (a, b), planned
    (a, b: the plans' seeds), interim (an arm is short of its plan), status
    (`shortfall`), result (`stats.compare`, None with a status; its
    verdicts "interim" while interim), ramp (its `ramp_sentence`, the
    complete ramp only), rule (the 36-epoch arm's `long_rule`)}]."""
    here = [r for r in runs if r["kind_of_machine"] == BASELINE_MACHINE]
    a = arm(here, "defaults", seeds=SEEDS, **DEFAULTS)
    out = []
    for name, sel, chosen in BASELINE_ARMS:
        b = arm(here, name, seeds=SEEDS, **sel)
        n = (len(a.seeds), len(b.seeds))
        plan = (planned(DEFAULTS), planned(sel))
        status = shortfall(*n)
        result = None if status else stats.compare(a, b, TARGETS)
        short = n[0] < plan[0] or n[1] < plan[1]
        if result and short:
            result = interim(result)
        out.append(dict(name=name, machine=BASELINE_MACHINE, chosen_on=chosen,
                        n=n, planned=plan, interim=bool(result) and short,
                        status=status, result=result,
                        ramp=ramp_sentence(result, ramp_start(sel))
                        if result and not short and sel["kind"] == "ramp"
                        else None,
                        rule=long_rule(here, a, None if out[0]["interim"]
                                       else out[0]["result"], sel)
                        if sel["epochs"] == 36 else None))
    return out


def baseline_lines(found):
    """One line a baseline: final accuracy and, per target, the ratio of
    median updates (defaults / baseline) with its verdict, the seeds that
    reach it and the ratio among those alone."""
    lines = []
    for f in found:
        claim = f"The defaults (grown from 128 at 0.4) against {f['name']}"
        where = f"{f['machine']}; seeds {SEEDS[0]}–{SEEDS[-1]}; "
        if f["status"]:
            lines.append(show.finding(claim, where, f["n"], f["status"]))
            continue
        parts = [show.accuracy(f["result"])]
        for t in TARGETS:
            x = f["result"]["targets"][t]
            parts.append(
                f"{show.target(t)}: updates ratio {show.interval(*x['ratio'], 3)} "
                f"**{x['verdict']}**{show.holm_mark(x)}{show.rank(x)} (reached "
                f"{x['a_reached']}/{f['n'][0]} "
                f"vs {x['b_reached']}/{f['n'][1]}; among those, "
                f"{show.interval(*x['reaching_ratio'], 3)})")
        lines.append(show.finding(
            claim, where, f["n"], planned=f["interim"] and f["planned"][1],
            how=f["chosen_on"], said="; ".join(parts))
            + "".join(f" {f[k]}" for k in ("ramp", "rule") if f[k]))
    return lines
