"""The critical batch measured directly, beside B_simple: branched probes
from the small batch's checkpoints (Merrill et al. 2025, arXiv:2505.23971;
McCandlish et al. 2018, arXiv:1812.06162). The probes and their settings:
the plan `probes` (`plans.py`).

`analyse` gives at each checkpoint: the critical batch (the largest whose
validation loss after the epoch stays within `TOLERANCE` of the small
batch's, every smaller one too), each batch's efficiency E_min / E (the
examples 128 needed to reach the loss the batch ends at, over those it
took; at most 1), B_noise fitted to McCandlish's 1 + B / B_noise (probes
whose loss rose left out), B_simple and the batch the defaults ask for.
"""

import math
import statistics

from bench.study import plans
from keras_largebatch.adaptive_batch import defaults
from keras_largebatch.adaptive_batch import policies

BATCHES = plans.PROBE_BATCHES
TOLERANCE = 0.02
SMALL = plans.SMALL_BATCH
C = defaults.NOISE_SCALE_MULTIPLE
START, CAP = SMALL * defaults.START_MULTIPLE, SMALL * defaults.MAX_MULTIPLE


def mccandlish_efficiency(batch, b_noise, b0):
    """Progress per example at `batch` over `b0`'s when the examples needed
    grow as 1 + B / B_noise."""
    return (1 + b0 / b_noise) / (1 + batch / b_noise)


def fit_b_noise(points, b0):
    """B_noise minimising the squared error of `mccandlish_efficiency`
    against `points` [(batch, efficiency), ...]: a log grid from b0 / 16
    to 10**6, then a golden-section search around its best."""
    def loss(log_b):
        return sum((mccandlish_efficiency(x, math.exp(log_b), b0) - e) ** 2
                   for x, e in points)

    lo, hi = math.log(b0 / 16), math.log(1e6)
    best = min((lo + (hi - lo) * i / 400 for i in range(401)), key=loss)
    a, b = best - (hi - lo) / 400, best + (hi - lo) / 400
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - g * (b - a), a + g * (b - a)
        a, b = (a, d) if loss(c) < loss(d) else (c, b)
    return math.exp((a + b) / 2)


def critical_batch(excess, tolerance):
    """The largest batch of {batch: loss above the small batch's} within
    `tolerance`, every smaller one too; None when even the smallest is
    not."""
    found = None
    for batch in sorted(excess):
        if excess[batch] > tolerance:
            break
        found = batch
    return found


def policy_batch(b_simple, c=C, start=START, cap=CAP):
    """The batch the defaults' policy asks for from `b_simple`
    (`policies.POLICIES[defaults.POLICY]`), at most `cap`."""
    inputs = policies.Inputs(epoch=0, batch_size=start, initial_steps=1, c=c,
                             schedule=None, b_simple=b_simple)
    steps = policies.POLICIES[defaults.POLICY].accumulation_steps(inputs)
    return min(cap, start * steps)


def examples_to(curve, loss, start_loss):
    """Examples at which `curve` [(examples, val_loss), ...] first reaches
    `loss` or below, linearly interpolated from the point before it
    ((0, `start_loss`) before the first); None if never."""
    prev_x, prev_l = 0.0, start_loss
    for x, current in curve:
        if current <= loss:
            if prev_l <= loss:
                return prev_x
            return prev_x + (prev_l - loss) / (prev_l - current) * (x - prev_x)
        prev_x, prev_l = x, current
    return None


def small_curves(points):
    """The small batch's probes of one checkpoint, one per seed whose whole
    epoch ran, with `curve` [(examples, val_loss), ...] from its points."""
    out = []
    for seed in sorted({p["seed"] for p in points}):
        mine = sorted((p for p in points if p["seed"] == seed),
                      key=lambda p: p["examples"])
        if not mine[-1].get("steps"):
            out.append(dict(mine[-1], curve=[[p["examples"], p["val_loss"]]
                                             for p in mine]))
    return out


def efficiency(probe, small):
    """`probe`'s efficiency against each of the `small` probes' curves."""
    reached = [examples_to(s["curve"], probe["val_loss"], s["start_val_loss"])
               for s in small]
    return [1.0 if x is None else min(1.0, x / probe["examples"])
            for x in reached]


def normalise(runs):
    """The probes as the analysis reads them (`val_loss`, `examples`,
    `b_simple`, `start_val_loss`), from a record of either form."""
    base = next((r for r in runs if r.get("variant") == "trajectory"), None)
    out = []
    for r in runs:
        if r.get("phase") != "probe":
            continue
        r = dict(r)
        if "val_loss" not in r:
            r["val_loss"] = r["val_loss_per_epoch"][-1]
            r["b_simple"] = (r.get("noise_scale_per_epoch") or [math.nan])[-1]
            r["examples"] = min(r["num_train"], (r["steps"] or math.inf)
                                * r["batch"])
        if "start_val_loss" not in r and base:
            r["start_val_loss"] = base["val_loss_per_epoch"][r["epoch_at"] - 1]
        out.append(r)
    return out


def analyse(runs, b0=SMALL, tolerance=TOLERANCE):
    """{epoch_at: summary}: the numbers of the module docstring."""
    probes, out = normalise(runs), {}
    for epoch in sorted({p["epoch_at"] for p in probes}):
        here = [p for p in probes if p["epoch_at"] == epoch]
        start = [p["val_loss"] for p in here if p.get("start")]
        if start:
            here = [dict(p, start_val_loss=start[0]) for p in here
                    if not p.get("start")]
        small = small_curves([p for p in here if p["batch"] == b0])
        here = [p for p in here if not p.get("steps")]
        if not small:
            continue
        each = {}
        for p in here:
            if p["batch"] != b0:
                each.setdefault(p["batch"], []).extend(efficiency(p, small))
        eff = {b: statistics.fmean(v) for b, v in sorted(each.items())}
        rose = sorted(p["batch"] for p in here if p["batch"] != b0
                      and p["val_loss"] >= small[0]["start_val_loss"])
        fitted = [(b, e) for b, e in eff.items() if b not in rose]
        ends = {}
        for p in here:
            ends.setdefault(p["batch"], []).append(p["val_loss"])
        excess = {b: statistics.fmean(v) - statistics.fmean(ends[b0])
                  for b, v in sorted(ends.items())}
        noise = {}
        for p in here:
            if math.isfinite(p.get("b_simple", math.nan)):
                noise.setdefault(p["batch"], []).append(p["b_simple"])
        b_simple = statistics.median(noise[min(noise)]) if noise else math.nan
        out[epoch] = dict(
            start_val_loss=small[0]["start_val_loss"], end_val_loss=ends,
            efficiency={b0: 1.0, **eff}, efficiency_each=each, excess=excess,
            critical=critical_batch(excess, tolerance),
            small_own=[e for p in small for e in efficiency(
                p, [q for q in small if q is not p])],
            small_fall=small[0]["start_val_loss"] - statistics.fmean(ends[b0]),
            rose=rose, b_noise=fit_b_noise(fitted, b0) if len(fitted) > 1 else None,
            b_simple=b_simple, b_simple_each=noise,
            policy_batch=policy_batch(b_simple))
    return out


def markdown(runs):
    """The two tables of `analyse`'s numbers."""
    summary = analyse(runs)
    lines = [
        "", "## The critical batch: branched probes and B_simple", "",
        f"Validation loss after one epoch above {SMALL}'s (each of its seeds' "
        f"own in the third column); critical: the largest batch within "
        f"{TOLERANCE:g}, every smaller one too.", "",
        f"| after epoch | val loss there | {SMALL} (each seed) | "
        + " | ".join(f"{b:,}" for b in BATCHES[1:]) + " | critical |",
        "|---|---|---|" + "---|" * len(BATCHES)]
    for epoch, s in summary.items():
        small = ", ".join(f"{v:.4f}" for v in s["end_val_loss"][SMALL])
        lines.append(f"| {epoch} | {s['start_val_loss']:.4f} | {small} | "
                     + " | ".join(f"{s['excess'][b]:+.4f}" if b in s["excess"]
                                  else "—" for b in BATCHES[1:])
                     + f" | {s['critical']:,} |")
    lines += ["", f"Efficiency E_min/E against {SMALL}'s curves (rose: "
              f"unstable, left out of the B_noise fit); B_simple and the "
              f"batch the defaults ask from it ({C:g} x B_simple on {START} "
              f"x 2**j, up to {CAP:,}).", "",
              f"| after epoch | {SMALL}'s fall | " + " | ".join(
                  f"{b:,}" for b in BATCHES) + " | B_noise | B_simple | "
              "defaults' batch |", "|---|---|" + "---|" * (len(BATCHES) + 3)]
    for epoch, s in summary.items():
        eff = [("rose" if b in s["rose"] else f"{s['efficiency'][b]:.2f}")
               if b in s["efficiency"] else "—" for b in BATCHES]
        lines.append(
            f"| {epoch} | {s['small_fall']:.4f} | " + " | ".join(eff) + " | "
            + ("—" if s["b_noise"] is None else f"{s['b_noise']:,.0f}")
            + f" | {s['b_simple']:,.0f} | {s['policy_batch']:,} |")
    return lines
