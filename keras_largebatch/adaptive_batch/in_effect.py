"""The batch in effect: k micro-batches per update and the rate's factor.

`AdaptiveBatch` decides a k; these functions put it into effect on the
accumulating optimizer (Keras' `gradient_accumulation_steps`, and the
rate times the rule's factor), as optax's `MultiSteps` owns its k. What
they keep is optimizer state, on the `NoiseScaleOptimizer` (`state`
below), because that wrapper is what every checkpoint holds:

- saved, so that a restored run goes on at the batch it had: the
  variables `accumulation_steps` (0 until first put into effect) and
  `learning_rate_factor`;
- found again when a fit starts (`reset`, then `restore_saved`): the
  attributes `pending_accumulation_steps` (a switch waiting for its
  micro-batch) and `base_learning_rate` (the compiled rate or schedule
  the factor scales).
"""

import math

import keras
from keras import ops

from keras_largebatch.noise_scale import accumulating_optimizer
from keras_largebatch.schedules import ScaledLearningRate


def steps(state):
    """The k in effect: micro-batches per update."""
    return accumulating_optimizer(state).gradient_accumulation_steps


def reset(state):
    """A fit starts: no switch pending, and `restore_saved` reads the
    compiled rate again."""
    state.pending_accumulation_steps = None
    state.base_learning_rate = None


def restore_saved(state):
    """Once per fit (until `reset`): reads the compiled rate the factor
    scales and puts the saved k and factor back into effect (a restored
    run). True when that changed k (the train function must be made
    again)."""
    if state.base_learning_rate is not None:
        return False
    factor = float(ops.convert_to_numpy(state.learning_rate_factor))
    inner = accumulating_optimizer(state)
    rate = inner._learning_rate
    if isinstance(rate, keras.Variable):
        state.base_learning_rate = float(ops.convert_to_numpy(rate)) / factor
    else:
        state.base_learning_rate = getattr(rate, "base", rate)
    saved = int(ops.convert_to_numpy(state.accumulation_steps))
    if saved and saved != inner.gradient_accumulation_steps:
        put_into_effect(state, saved, factor)
        return True
    state.accumulation_steps.assign(inner.gradient_accumulation_steps)
    return False


def ask(state, k, shrink=False):
    """Asks for k micro-batches per update from the next micro-batch that
    both k and the k in effect divide: never fewer than in effect or asked
    before, unless `shrink` (then k as asked, fewer or more); True while a
    switch is pending."""
    now = steps(state)
    if shrink:
        state.pending_accumulation_steps = k if k != now else None
        return state.pending_accumulation_steps is not None
    k = max(k, state.pending_accumulation_steps or 0)
    if k > now:
        state.pending_accumulation_steps = k
    return state.pending_accumulation_steps is not None


def micro_batches_to_switch(state, counter):
    """How many micro-batches, from the micro-batch `counter`, before the
    pending k can start (0: now): at a multiple of both ks, where the
    update in progress ends and one of the new k begins (for `k0 * 2**j`,
    the larger k; for a schedule's other multiples, their lcm)."""
    return -counter % math.lcm(state.pending_accumulation_steps, steps(state))


def put_into_effect(state, k, factor):
    """k micro-batches per update and `factor` times the compiled rate (a
    `ScaledLearningRate` on a schedule), saved with `state`."""
    inner = accumulating_optimizer(state)
    inner.gradient_accumulation_steps = k
    base = state.base_learning_rate
    if isinstance(base, (int, float)):
        inner.learning_rate.assign(base * factor)
    elif factor == 1.0:
        inner.learning_rate = base
    else:
        inner.learning_rate = ScaledLearningRate(base, factor)
    state.accumulation_steps.assign(k)
    state.learning_rate_factor.assign(factor)
    state.pending_accumulation_steps = None
