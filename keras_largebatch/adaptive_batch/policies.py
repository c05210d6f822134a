"""The policies of `AdaptiveBatch`: which update batch an epoch asks for.

One entry per policy: a `Policy` subclass registered with `register`,
whose name is the `policy=` argument (and a choice of `--adaptive_batch`),
whose docstring says the rule, whose attributes say what it needs and
whose `accumulation_steps` decides. `AdaptiveBatch` and the command's
flags read `POLICIES` and nothing else.
"""

import math
from typing import NamedTuple

from keras_largebatch._shared import registrar

POLICIES = {}
"""Name -> the registered `Policy`, in registration order."""


class Inputs(NamedTuple):
    """What a policy decides from at an epoch's start."""

    epoch: int  # 0-based, as Keras counts
    batch_size: int  # one micro-batch, all replicas
    initial_steps: int  # k0, the compiled gradient_accumulation_steps
    c: float  # the batch target as a multiple of B_simple
    schedule: list  # [(epoch, batch), ...], or None
    b_simple: float  # NaN unless the policy `reads_noise_scale`


class Policy:
    """A policy of `AdaptiveBatch`.

    Attributes:
        name: the `policy=` argument that picks it.
        takes_schedule: it reads `schedule=[(epoch, batch), ...]` (which
            also gives `max_batch_size` its default and the first batch);
            without it, `schedule` must be None, and `AdaptiveBatch`'s
            `start_multiple` and default `max_batch_size` apply.
        takes_multiple: it reads `c` (`--noise_scale_multiple`); without
            it, the command requires the flag's default.
        reads_noise_scale: it reads B_simple from the statistics.
    """

    name = None
    takes_schedule = False
    takes_multiple = False
    reads_noise_scale = False

    def accumulation_steps(self, inputs):
        """The micro-batches per update this epoch asks for, given
        `inputs` (`Inputs`), before `AdaptiveBatch` caps it at
        `max_batch_size` and keeps it from shrinking."""
        raise NotImplementedError(type(self).__name__)


# Adds an instance of a `Policy` subclass to `POLICIES`.
register = registrar(POLICIES, Policy)


@register
class NoiseScale(Policy):
    """McCandlish et al.'s balanced point: the batch nearest, in log scale,
    to `c * B_simple` among `batch_size * k0 * 2**j`; k0 until B_simple is
    measured (finite and > 0).

    ```python
    k = k0 * 2 ** max(0, round(log2(c * B_simple / (batch_size * k0))))
    ```
    """

    name = "noise_scale"
    takes_multiple = True
    reads_noise_scale = True

    def accumulation_steps(self, inputs):
        k0, b_simple = inputs.initial_steps, inputs.b_simple
        if not (math.isfinite(b_simple) and b_simple > 0):
            return k0
        target = inputs.c * b_simple / (inputs.batch_size * k0)
        return k0 * 2 ** max(0, round(math.log2(target)))


@register
class Schedule(Policy):
    """Smith et al.'s schedule: the batch of the last `(epoch, batch)` step
    at or before this epoch; `batch_size * k0` before the first."""

    name = "schedule"
    takes_schedule = True

    def accumulation_steps(self, inputs):
        batch = inputs.batch_size * inputs.initial_steps
        for start, size in inputs.schedule:
            if start <= inputs.epoch:
                batch = size
        return batch // inputs.batch_size
