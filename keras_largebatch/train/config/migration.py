"""Runs recorded by older versions, read in today's flags (`upgrade`).

A run recorded before `--adaptive_start_multiple` existed (and with it the
adaptive batch's present defaults, `adaptive_batch.defaults`) is compared
in today's flags: it resumes with the defaults it was started with, which
the flags left out of the command take (`CHANGED_DEFAULTS`, through
`load.resolve`), so the same command line goes on with the same
decisions. Likewise a run recorded before `--adaptive_anneal_fraction`
existed resumes without an anneal. Any other flag that a run did not
record is newer than the run and takes its default, which a flag is added
with so that it changes nothing (`--nesterov`: no Nesterov): so adding a
flag needs no entry here, and resuming such a run with another value of
it is refused as any change is.
"""

from keras_largebatch.adaptive_batch import defaults as adaptive_defaults
from keras_largebatch.adaptive_batch import policies as adaptive_policies
from keras_largebatch.train.config.table import TABLE


# The flags whose meaning of a default changed with the adaptive batch's
# defaults: left out of a resuming command, they take the run's value.
CHANGED_DEFAULTS = ("noise_scale_multiple", "adaptive_learning_rate",
                    "adaptive_start_multiple", "adaptive_anneal_fraction",
                    "adaptive_anneal_multiple")
MARKER = "adaptive_start_multiple"  # absent: recorded before the change
ANNEAL_MARKER = "adaptive_anneal_fraction"  # absent: recorded before it


def upgrade(original):
    """`original` (a run_config.json) in today's flags: the adaptive
    batch's defaults it ran with (`previous_adaptive_defaults`), then the
    default of each recorded flag it lacks."""
    upgraded = previous_adaptive_defaults(original)
    for flag in TABLE:
        if flag.recorded:
            upgraded.setdefault(flag.name, flag.default)
    return upgraded


def previous_adaptive_defaults(original):
    """`original` with the adaptive batch's flags it ran with: one recorded
    before `MARKER` existed gets the adaptive batch's previous defaults
    (`adaptive_batch.defaults.PREVIOUS`): no start multiple, `auto` as it
    resolved then, and for a run without a noise-scale policy the
    multiple it could not set (today's default); one recorded before
    `ANNEAL_MARKER` existed gets no anneal (a policy with a schedule, which
    takes none, today's defaults)."""
    upgraded = dict(original)
    policy = adaptive_policies.POLICIES.get(original.get("adaptive_batch"))
    if ANNEAL_MARKER not in original:
        grows = policy is not None and not policy.takes_schedule
        upgraded[ANNEAL_MARKER] = (
            0.0 if grows else adaptive_defaults.ANNEAL_FRACTION)
        upgraded["adaptive_anneal_multiple"] = (
            adaptive_defaults.ANNEAL_MULTIPLE)
    if MARKER in original:
        return upgraded
    upgraded[MARKER] = 1 if policy else 0
    if upgraded.get("adaptive_learning_rate") == "auto" and policy:
        upgraded["adaptive_learning_rate"] = (
            adaptive_defaults.PREVIOUS["auto_rule_for_sgd"]
            if original.get("optimizer") == "sgd"
            else adaptive_defaults.AUTO_RULE_OTHERWISE)
    if not (policy and policy.takes_multiple) and upgraded.get(
            "noise_scale_multiple") == adaptive_defaults.PREVIOUS[
                "noise_scale_multiple"]:
        upgraded["noise_scale_multiple"] = (
            adaptive_defaults.NOISE_SCALE_MULTIPLE)
    return upgraded
