"""Growing the batch during `fit`: more micro-batches per update as the
gradient noise grows.

The update batch is `batch_size * k`: `fit` runs micro-batches of
`batch_size` examples (all replicas together) and the optimizer accumulates
k of them per update (Keras' `gradient_accumulation_steps`). `AdaptiveBatch`
raises k by powers of 2 at epoch starts:

```python
# policy="noise_scale": McCandlish et al.'s balanced point, c * B_simple
k = k0 * 2 ** round(log2(c * B_simple / (batch_size * k0)))
# policy="schedule": Smith et al., from [(epoch, batch), ...]
k = batch / batch_size
k = min(max(k, k_now), max_batch_size / batch_size)      # never shrinks
```

References:
    - Smith, Kindermans, Ying & Le, 2018, "Don't Decay the Learning Rate,
      Increase the Batch Size", arXiv:1711.00489.
    - McCandlish et al., 2018, "An Empirical Model of Large-Batch
      Training", arXiv:1812.06162.
    - Johnson, Agrawal, Gu & Guestrin, 2020, "AdaScale SGD: A User-Friendly
      Algorithm for Distributed Training", arXiv:2007.05105.
"""

import math

import keras
from keras import ops

from keras_largebatch import noise_scale
from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import is_number
from keras_largebatch._shared import require
from keras_largebatch.api_export import keras_largebatch_export

POLICIES = ("noise_scale", "schedule")
LEARNING_RATE_RULES = ("auto", "unchanged", "adascale", "linear", "sqrt")


@keras_largebatch_export("keras_largebatch.AdaptiveBatch")
class AdaptiveBatch(keras.callbacks.Callback):
    """Grows the update batch during `fit` by accumulating more micro-batches.

    `fit(batch_size=batch_size)` runs micro-batches; the compiled optimizer
    (or the inner one of a loss-scale optimizer: `LARSMixed`, `LAMBMixed`)
    accumulates `k` of them per update, starting from its
    `gradient_accumulation_steps = k0 >= 2` (Keras creates its accumulators
    only then). At the start of each epoch the callback picks k:

    - `policy="noise_scale"`: the batch nearest (in log scale) to
      `c * B_simple` among `batch_size * k0 * 2**j`, B_simple read from the
      `NoiseScaleOptimizer` statistics (`c = 1`: McCandlish et al.'s
      balanced point, twice the minimum steps and examples);
    - `policy="schedule"`: the batch of the last `(epoch, batch)` step of
      `schedule` at or before this epoch (0-based, as Keras counts), Smith
      et al.'s schedule;

    never below the current k nor above `max_batch_size`. The new k takes
    effect at the first micro-batch whose index (`optimizer._iterations`,
    which Keras counts in micro-batches) is a multiple of it: no
    accumulated gradient is dropped or mis-averaged. The change keeps the
    optimizer's state, the loss scale and the data position, and re-makes
    the train function once (one retrace).

    The learning rate follows examples, not updates: Keras calls a schedule
    with the micro-batch count, unchanged by k. `learning_rate_rule` sets
    how the rate follows k relative to `k0`, as a factor on the compiled
    rate or schedule (applied at each change):

    - `"auto"` (the default): `"sqrt"` for Keras' `SGD` (alone or inside
      a `LossScaleOptimizer`), `"unchanged"` for every other optimizer
      (LARS, LAMB and their mixed forms, Adam, ...), whose steps are
      normalised by the gradient's size, which falls as the batch grows;
    - `"sqrt"`: `sqrt(S)`, with `S = k / k0`;
    - `"unchanged"` (Smith et al.: the growing batch replaces part of the
      decay);
    - `"adascale"`: AdaScale's gain `r = (sigma^2 + mu^2) /
      (sigma^2 / S + mu^2)` with `S = k / k0`, `sigma^2 = tr(Sigma) / B0`,
      `mu^2 = |G|^2` (so `r = (B_simple/B0 + 1) / (B_simple/(S B0) + 1)`,
      `B0 = batch_size * k0`), from the statistics at the change;
    - `"linear"`: `S`.

    `"auto"` picks, per optimizer family, the rule that kept the most
    accuracy for the fewest updates in docs/large-batch-study.md's
    comparison ("Growing the batch"): `"sqrt"` for SGD, `"unchanged"` for
    LARSMixed and LAMBMixed.

    State: the k in effect and the rate factor are variables of the
    `NoiseScaleOptimizer` (created in `set_model` around `model.optimizer`
    if it holds none), saved with the optimizer: a run restored by
    `BackupAndRestore` goes on at the batch it had. Every replica and
    process takes the same decision at the same micro-batch: the
    statistics come from reduced gradients and the counter is global.

    After a change, Keras' `optimizer.iterations` (micro-batches // k)
    counts updates as if the run had used the current k throughout; the
    updates taken are `NoiseScaleOptimizer.updates`.

    At each epoch's end the logs get `global_batch_size` (`batch_size * k`
    in effect), `updates` (taken so far) and the noise-scale entries of
    `GradientNoiseScale`.

    Args:
        batch_size: Int >= 1, the examples of one step of `fit` across
            replicas (one micro-batch).
        max_batch_size: Int, a multiple of `batch_size`, the largest update
            batch. Required for `"noise_scale"`; for `"schedule"` it
            defaults to the schedule's largest batch.
        policy: `"noise_scale"` (default) or `"schedule"`.
        c: Float > 0, the batch target as a multiple of B_simple. Defaults
            to `1.0`.
        schedule: For `"schedule"` only: a list of `(epoch, batch)`, epochs
            increasing from 0, batches non-decreasing multiples of
            `batch_size` (each `batch_size * k0` times a power of 2).
        learning_rate_rule: `"auto"` (default), `"sqrt"`,
            `"unchanged"`, `"adascale"` or `"linear"`.
        beta, interval: The `NoiseScaleOptimizer`'s, if this callback
            creates it (see `GradientNoiseScale`); `None`: the compiled
            one's, else `0.99` and `1` (every update measured: the
            decisions read the averages, whose lag grows with the
            interval).

    References:
        - Smith et al., 2018, arXiv:1711.00489.
        - McCandlish et al., 2018, arXiv:1812.06162.
        - Johnson et al., 2020, arXiv:2007.05105.
    """

    def __init__(self, batch_size, max_batch_size=None, policy="noise_scale",
                 c=1.0, schedule=None, learning_rate_rule="auto",
                 beta=None, interval=None):
        super().__init__()
        check_int("batch_size", batch_size, 1)
        require(policy in POLICIES, "policy", policy,
                " or ".join(repr(p) for p in POLICIES))
        check_number("c", c, lambda x: x > 0, "> 0")
        require(learning_rate_rule in LEARNING_RATE_RULES,
                "learning_rate_rule", learning_rate_rule,
                "one of " + ", ".join(repr(r) for r in LEARNING_RATE_RULES))
        if beta is not None:
            check_number("beta", beta, lambda x: 0 <= x < 1, "in [0, 1)")
        if interval is not None:
            check_int("interval", interval, 1)
        if policy == "schedule":
            schedule = _check_schedule(schedule, batch_size)
        else:
            require(schedule is None, "schedule", schedule,
                    "None unless `policy='schedule'`")
            require(max_batch_size is not None, "max_batch_size",
                    max_batch_size, "an int for `policy='noise_scale'`")
        if max_batch_size is None:
            max_batch_size = schedule[-1][1]
        require(_is_int(max_batch_size) and max_batch_size >= batch_size
                and max_batch_size % batch_size == 0,
                "max_batch_size", max_batch_size,
                f"a multiple of `batch_size` ({batch_size})")
        if schedule:
            last = schedule[-1][1]
            require(last <= max_batch_size, "schedule", schedule,
                    f"batches <= `max_batch_size` ({max_batch_size})")
        self.batch_size = batch_size
        self.max_batch_size = max_batch_size
        self.policy = policy
        self.c = float(c)
        self.schedule = schedule
        self.learning_rate_rule = learning_rate_rule
        self.beta = beta
        self.interval = interval
        self.state = None
        self._pending = None

    def set_model(self, model):
        super().set_model(model)
        self.state = noise_scale.install(model, self.beta, self.interval)
        k0 = self.state.initial_accumulation_steps
        require(k0 is not None and k0 >= 2, "gradient_accumulation_steps", k0,
                "an int >= 2 on the compiled optimizer (its inner one for a "
                "loss-scale optimizer), so that Keras creates the "
                "accumulators AdaptiveBatch grows")
        require(self.max_batch_size >= self.batch_size * k0, "max_batch_size",
                self.max_batch_size, f">= the starting batch, batch_size * "
                f"gradient_accumulation_steps = {self.batch_size * k0}")
        for _, batch in self.schedule or ():
            ratio = batch // self.batch_size
            require(batch >= self.batch_size * k0 and ratio % k0 == 0
                    and _power_of_2(ratio // k0), "schedule", self.schedule,
                    f"batches of batch_size * {k0} * 2**j "
                    f"({self.batch_size * k0}, {self.batch_size * k0 * 2}, "
                    "...)")
        self._base_rate = None
        self._pending = None

    @property
    def accumulation_steps(self):
        """The k in effect: micro-batches per update."""
        return noise_scale.accumulating_optimizer(
            self.state).gradient_accumulation_steps

    @property
    def global_batch_size(self):
        """The update batch in effect, `batch_size * k`."""
        return self.batch_size * self.accumulation_steps

    def on_epoch_begin(self, epoch, logs=None):
        if self._base_rate is None:
            self._resume()
        k = self._decide(epoch)
        if self._pending is not None:
            k = max(k, self._pending)
        if k > self.accumulation_steps:
            self._pending = k
            self._switch_when_aligned(0)

    def on_train_batch_begin(self, batch, logs=None):
        if self._pending is not None and batch >= self._check_at:
            self._switch_when_aligned(batch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs["global_batch_size"] = self.global_batch_size
        logs["updates"] = int(ops.convert_to_numpy(self.state.updates))
        logs.update(self.state.result(self.batch_size))

    def _resume(self):
        """Takes back the k and rate factor the state holds (a restored
        run), and the compiled rate they scale."""
        state = self.state
        factor = float(ops.convert_to_numpy(state.learning_rate_factor))
        rate = _rate_owner(state)._learning_rate
        if isinstance(rate, keras.Variable):
            self._base_rate = float(ops.convert_to_numpy(rate)) / factor
        else:
            self._base_rate = getattr(rate, "base", rate)
        saved = int(ops.convert_to_numpy(state.accumulation_steps))
        if saved > self.accumulation_steps:
            self._apply(saved, factor)
        else:
            state.accumulation_steps.assign(self.accumulation_steps)

    def _decide(self, epoch):
        """The k this epoch's start asks for (before never-shrink)."""
        k0 = self.state.initial_accumulation_steps
        largest = k0 * 2 ** int(math.log2(
            self.max_batch_size // (self.batch_size * k0)))
        if self.policy == "schedule":
            batch = self.batch_size * k0
            for start, size in self.schedule:
                if start <= epoch:
                    batch = size
            return min(batch // self.batch_size, largest)
        b_simple = self.state.result(self.batch_size)[
            "gradient_noise_scale"]
        if not (math.isfinite(b_simple) and b_simple > 0):
            return k0
        target = self.c * b_simple / (self.batch_size * k0)
        return min(k0 * 2 ** max(0, round(math.log2(target))), largest)

    def _switch_when_aligned(self, batch):
        # On JAX `self.model` syncs the state, so the counter is current.
        counter = noise_scale.accumulating_optimizer(
            self.model.optimizer)._iterations
        k = self._pending
        left = -int(ops.convert_to_numpy(counter)) % k
        if left == 0:
            self._pending = None
            self._apply(k, self._factor(k))
        else:
            self._check_at = batch + left

    def resolved_rule(self):
        """`learning_rate_rule`, with `"auto"` resolved for the compiled
        optimizer (see the class docstring)."""
        if self.learning_rate_rule != "auto":
            return self.learning_rate_rule
        inner = noise_scale.accumulating_optimizer(self.state)
        return ("sqrt" if isinstance(inner, keras.optimizers.SGD)
                else "unchanged")

    def _factor(self, k):
        """The rate factor of `learning_rate_rule` at k."""
        scale = k / self.state.initial_accumulation_steps
        rule = self.resolved_rule()
        if rule == "unchanged":
            return 1.0
        if rule == "linear":
            return scale
        if rule == "sqrt":
            return math.sqrt(scale)
        b_simple = self.state.result(self.batch_size)["gradient_noise_scale"]
        if not (math.isfinite(b_simple) and b_simple > 0):
            return scale  # |G|^2 not measurable: noise dominates.
        ratio = b_simple / (self.batch_size
                            * self.state.initial_accumulation_steps)
        return (ratio + 1) / (ratio / scale + 1)

    def _apply(self, k, factor):
        state = self.state
        noise_scale.accumulating_optimizer(
            state).gradient_accumulation_steps = k
        owner = _rate_owner(state)
        if isinstance(self._base_rate, (int, float)):
            owner.learning_rate.assign(self._base_rate * factor)
        elif factor == 1.0:
            owner.learning_rate = self._base_rate
        else:
            owner.learning_rate = ScaledLearningRate(self._base_rate, factor)
        state.accumulation_steps.assign(k)
        state.learning_rate_factor.assign(factor)
        self.model.make_train_function(force=True)

    def get_config(self):
        return {
            "batch_size": self.batch_size,
            "max_batch_size": self.max_batch_size,
            "policy": self.policy,
            "c": self.c,
            "schedule": self.schedule,
            "learning_rate_rule": self.learning_rate_rule,
            "beta": self.beta,
            "interval": self.interval,
        }


@keras_largebatch_export("keras_largebatch.adaptive_batch.ScaledLearningRate")
class ScaledLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """`factor * base(step)`: a schedule (or a callable of no argument,
    as Keras' optimizers take) times a constant.

    Args:
        base: A `LearningRateSchedule` or a callable.
        factor: Float > 0.
    """

    def __init__(self, base, factor):
        check_number("factor", factor, lambda x: x > 0, "> 0")
        self.base = base
        self.factor = float(factor)

    def __call__(self, step):
        if isinstance(self.base, keras.optimizers.schedules.LearningRateSchedule):
            return self.base(step) * self.factor
        return self.base() * self.factor

    def get_config(self):
        return {"base": keras.saving.serialize_keras_object(self.base),
                "factor": self.factor}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["base"] = keras.saving.deserialize_keras_object(config["base"])
        return cls(**config)


def _rate_owner(state):
    """The optimizer whose rate the chain uses: the innermost."""
    return noise_scale.accumulating_optimizer(state)


def _check_schedule(schedule, batch_size):
    valid = (isinstance(schedule, (list, tuple)) and len(schedule) > 0
             and all(isinstance(s, (list, tuple)) and len(s) == 2
                     and _is_int(s[0]) and s[0] >= 0 and _is_int(s[1])
                     and s[1] >= batch_size and s[1] % batch_size == 0
                     for s in schedule))
    valid = valid and all(
        a[0] < b[0] and a[1] <= b[1] for a, b in zip(schedule, schedule[1:]))
    require(valid, "schedule", schedule,
            "a non-empty list of (epoch, batch) for `policy='schedule'`: "
            "epochs increasing from 0, batches non-decreasing multiples of "
            f"`batch_size` ({batch_size})")
    return [tuple(s) for s in schedule]


def _is_int(x):
    return is_number(x) and isinstance(x, int)


def _power_of_2(n):
    return n >= 1 and n & (n - 1) == 0
