"""The batches the adaptive batch may take, and the checks of its settings.

An update batch is k micro-batches of `batch_size` examples (all
replicas): the policies without a schedule take `k0 * 2**j`, `k0` the
compiled `gradient_accumulation_steps`; a schedule may name any multiple
of `batch_size` from `batch_size * k0` on (a linear ramp). Each switch of
k falls where an update of both the old and the new k ends.

`AdaptiveBatch` and the command's flags check their settings here, once:
`resolve` what the arguments alone decide, `check_compiled` what needs
`k0`. Each error names a setting as its caller's user wrote it (`Names`:
the callback's arguments by default, the flags in `train/config/table.py`).
"""

import math
from typing import NamedTuple

from keras_largebatch._shared import check_int
from keras_largebatch._shared import is_number
from keras_largebatch._shared import require
from keras_largebatch.adaptive_batch import defaults
from keras_largebatch.adaptive_batch import policies
from keras_largebatch.adaptive_batch import rules


class Settings(NamedTuple):
    """`AdaptiveBatch`'s arguments that decide the batches (None: the
    default)."""

    batch_size: int
    max_batch_size: object = None
    policy: str = defaults.POLICY
    c: float = defaults.NOISE_SCALE_MULTIPLE
    schedule: object = None
    learning_rate_rule: str = defaults.LEARNING_RATE_RULE
    start_multiple: object = None
    anneal_fraction: object = None
    anneal_multiple: int = defaults.ANNEAL_MULTIPLE


class Names:
    """How errors name the settings: `AdaptiveBatch`'s arguments unless
    `names` ({argument: name}), `mentions` ({argument: how the text of
    an error refers to it}) and `shown` ({argument: the value echoed})
    say otherwise."""

    def __init__(self, names=(), mentions=(), shown=()):
        self._names = dict(names)
        self._mentions = dict(mentions)
        self._shown = dict(shown)

    def require(self, condition, argument, value, expected):
        """`_shared.require`, naming `argument` as the user wrote it."""
        require(condition, self._names.get(argument, argument),
                self._shown.get(argument, value), expected)

    def __getitem__(self, argument):
        return self._mentions.get(argument, f"`{argument}`")

    def setting(self, argument, value):
        """`argument` set to `value`, as an error's text refers to it."""
        if argument in self._mentions:
            return f"{self._mentions[argument]}={value}"
        return f"`{argument}={value!r}`"


ARGUMENTS = Names()


def resolve(settings, names=ARGUMENTS):
    """`settings` checked, with the defaults their policy implies filled in
    (`start_multiple`, `anneal_fraction`; `max_batch_size` from a
    schedule) and the schedule as tuples; raises the Keras-style
    `ValueError` naming the first bad setting."""
    s, n = settings, names
    check_int("batch_size", s.batch_size, 1)
    n.require(s.policy in policies.POLICIES, "policy", s.policy,
              " or ".join(repr(p) for p in policies.POLICIES))
    n.require(is_number(s.c) and s.c > 0, "c", s.c, "a float > 0")
    n.require(s.learning_rate_rule in rules.RULES, "learning_rate_rule",
              s.learning_rate_rule,
              "one of " + ", ".join(repr(r) for r in rules.RULES))
    takes_schedule = policies.POLICIES[s.policy].takes_schedule
    start_multiple, anneal_fraction = s.start_multiple, s.anneal_fraction
    if start_multiple is None:
        start_multiple = 1 if takes_schedule else defaults.START_MULTIPLE
    n.require(is_power_of_2(start_multiple), "start_multiple",
              start_multiple, "a power of 2 >= 1")
    if anneal_fraction is None:
        anneal_fraction = 0.0 if takes_schedule else defaults.ANNEAL_FRACTION
    n.require(is_number(anneal_fraction) and 0 <= anneal_fraction < 1,
              "anneal_fraction", anneal_fraction, "a float in [0, 1)")
    n.require(is_power_of_2(s.anneal_multiple), "anneal_multiple",
              s.anneal_multiple, "a power of 2 >= 1")
    schedule, largest = s.schedule, s.max_batch_size
    with_policy = f"with {n.setting('policy', s.policy)}"
    if takes_schedule:
        schedule = _check_schedule(schedule, s, n)
        n.require(start_multiple == 1, "start_multiple", start_multiple,
                  f"1 {with_policy} (its schedule gives the batches)")
        n.require(anneal_fraction == 0, "anneal_fraction", anneal_fraction,
                  f"0 {with_policy} (its schedule gives the batches)")
        if largest is None:
            largest = schedule[-1][1]
    else:
        n.require(schedule is None, "schedule", schedule,
                  "given only with " + " or ".join(
                      n.setting("policy", name) for name, policy
                      in policies.POLICIES.items() if policy.takes_schedule))
    n.require(largest is None or (
                  _is_int(largest) and largest >= s.batch_size
                  and largest % s.batch_size == 0),
              "max_batch_size", largest,
              f"a multiple of {n['batch_size']} ({s.batch_size})")
    if schedule:
        n.require(schedule[-1][1] <= largest, "schedule", schedule,
                  f"batches <= {n['max_batch_size']} ({largest})")
    return s._replace(max_batch_size=largest, schedule=schedule,
                      start_multiple=start_multiple,
                      anneal_fraction=float(anneal_fraction))


def check_compiled(settings, k0, names=ARGUMENTS):
    """The largest update batch of `settings` (resolved) under `k0`
    micro-batches per update as compiled, checked: `k0 >= 2`, room for
    the first batch, a schedule's batches at least `batch_size * k0` (any
    multiple of `batch_size`: a switch waits for a micro-batch where an
    update of both ks ends, `in_effect.micro_batches_to_switch`)."""
    s, n = settings, names
    n.require(_is_int(k0) and k0 >= 2, "gradient_accumulation_steps", k0,
              "an int >= 2 (the batch grows by accumulating more "
              "micro-batches per update, and Keras accumulates only from 2)")
    start = s.batch_size * k0
    largest = s.max_batch_size or start * defaults.MAX_MULTIPLE
    first = start * s.start_multiple
    n.require(largest >= first, "max_batch_size", largest,
              f">= the first batch, {first} = {start} x "
              f"{n['start_multiple']}")
    n.require(all(batch >= start for _, batch in s.schedule or ()),
              "schedule", s.schedule, f"batches of at least {start} "
              f"({n['batch_size']} x the compiled "
              f"{n['gradient_accumulation_steps']})")
    return largest


def largest_accumulation_steps(batch_size, k0, max_batch_size,
                               any_multiple=False):
    """The largest k whose batch is at most `max_batch_size`: among
    `k0 * 2**j`, or with `any_multiple` (a schedule's) among all ints."""
    if any_multiple:
        return max_batch_size // batch_size
    return k0 * 2 ** int(math.log2(max_batch_size // (batch_size * k0)))


def _check_schedule(schedule, settings, names):
    """`schedule` as a list of `(epoch, batch)` tuples; raises unless it is
    a non-empty list of pairs of ints, epochs increasing from 0, batches
    non-decreasing multiples of `batch_size`."""
    size = settings.batch_size
    valid = (isinstance(schedule, (list, tuple)) and len(schedule) > 0
             and all(isinstance(s, (list, tuple)) and len(s) == 2
                     and _is_int(s[0]) and s[0] >= 0 and _is_int(s[1])
                     and s[1] >= size and s[1] % size == 0
                     for s in schedule))
    valid = valid and epochs_increase(schedule) and all(
        a[1] <= b[1] for a, b in zip(schedule, schedule[1:]))
    names.require(valid, "schedule", schedule,
                  "a non-empty list of (epoch, batch) with "
                  f"{names.setting('policy', settings.policy)}: epochs "
                  "increasing from 0, batches non-decreasing multiples of "
                  f"{names['batch_size']} ({size})")
    return [tuple(s) for s in schedule]


def epochs_increase(schedule):
    """Whether the epochs of `[(epoch, batch), ...]` strictly increase."""
    return all(a[0] < b[0] for a, b in zip(schedule, schedule[1:]))


def is_power_of_2(n):
    """Whether `n` is an int (not a bool) among 1, 2, 4, 8, ..."""
    return _is_int(n) and n >= 1 and n & (n - 1) == 0


def _is_int(x):
    return is_number(x) and isinstance(x, int)
