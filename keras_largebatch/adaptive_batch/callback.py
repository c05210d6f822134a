"""`AdaptiveBatch`: the callback that applies the policies' decisions."""

import math

import keras
from keras import ops

from keras_largebatch import noise_scale
from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch.adaptive_batch import batches
from keras_largebatch.adaptive_batch import defaults
from keras_largebatch.adaptive_batch import in_effect
from keras_largebatch.adaptive_batch import policies
from keras_largebatch.adaptive_batch import rules
from keras_largebatch.api_export import keras_largebatch_export


@keras_largebatch_export("keras_largebatch.AdaptiveBatch")
class AdaptiveBatch(keras.callbacks.Callback):
    """Grows the update batch during `fit` by accumulating more micro-batches.

    `fit(batch_size=batch_size)` runs micro-batches; the compiled optimizer
    (or the inner one of a loss-scale optimizer: `LARSMixed`, `LAMBMixed`)
    accumulates `k` of them per update, starting from its
    `gradient_accumulation_steps = k0 >= 2` (Keras creates its accumulators
    only then). At the start of each epoch the `policy` (an entry of
    `policies.POLICIES`) picks k:

    - `"noise_scale"`: the batch nearest (in log scale) to `c * B_simple`
      among `batch_size * k0 * 2**j`, B_simple read from the
      `NoiseScaleOptimizer` statistics (`c = 1`: McCandlish et al.'s
      balanced point, twice the minimum steps and examples);
    - `"schedule"`: the batch of the last `(epoch, batch)` step of
      `schedule` at or before this epoch (0-based, as Keras counts), Smith
      et al.'s schedule;

    never below the current k nor above `max_batch_size`, and, for a
    policy without a schedule, never below `start_multiple * k0`: from the
    first epoch the batch is at least `start_multiple` times the compiled
    one, its rate scaled by the rule. For a policy without a schedule,
    over the last `anneal_fraction` of `fit`'s epochs (the last
    `floor(anneal_fraction * epochs + 0.5)` of them) the batch is at most
    `anneal_multiple * batch_size * k0`: it comes back down, so that the
    end of the rate's decay gets the updates of a smaller batch. The new k
    takes effect at the first micro-batch whose index
    (`optimizer._iterations`, which Keras counts in micro-batches) is a
    multiple of both it and the k in effect: no accumulated gradient is
    dropped or mis-averaged. The change keeps the
    optimizer's state, the loss scale and the data position, and re-makes
    the train function once (one retrace).

    The learning rate follows examples, not updates: Keras calls a schedule
    with the micro-batch count, unchanged by k. `learning_rate_rule` (an
    entry of `rules.RULES`) sets how the rate follows k relative to `k0`,
    as a factor on the compiled rate or schedule (applied at each change),
    with `S = k / k0`: `"auto"` (the default: `"linear"` for Keras' `SGD`,
    alone or inside a `LossScaleOptimizer`, `"unchanged"` for every other
    optimizer, whose steps are normalised by the gradient's size),
    `"sqrt"` (`sqrt(S)`), `"unchanged"` (Smith et al.), `"adascale"`
    (AdaScale's gain, from the statistics at the change) or `"linear"`
    (`S`).

    State: the batch in effect is the `NoiseScaleOptimizer`'s (created in
    `set_model` around `model.optimizer` if it holds none; `in_effect.py`):
    the k in effect and the rate factor are its variables, saved with the
    optimizer, so a run restored by `BackupAndRestore` goes on at the
    batch it had; this callback decides and re-makes the train function.
    Every replica and process takes the same decision at the same
    micro-batch: the statistics come from reduced gradients and the
    counter is global.

    After a change, Keras' `optimizer.iterations` (micro-batches // k)
    counts updates as if the run had used the current k throughout; the
    updates taken are `NoiseScaleOptimizer.updates`.

    At each epoch's end the logs get `global_batch_size` (`batch_size * k`
    in effect), `updates` (taken so far) and the noise-scale entries of
    `GradientNoiseScale`.

    The defaults (`defaults.py`): a user who gives the small batch and its
    tuned rate starts at 4 x that batch, follows 4 x B_simple, up to 8 x
    (how that compares with tuned fixed batches: docs/large-batch-study.md).
    A restored run keeps the k and rate factor it saved, and decides on
    with the arguments given. The arguments are checked in `batches.py`,
    which the command's flags share.

    Args:
        batch_size: Int >= 1, the examples of one step of `fit` across
            replicas (one micro-batch).
        max_batch_size: Int, a multiple of `batch_size`, the largest update
            batch. If the policy takes a schedule, defaults to the
            schedule's largest batch; else to `defaults.MAX_MULTIPLE` (8)
            times the compiled batch, `batch_size * k0`.
        policy: A name in `policies.POLICIES`: `"noise_scale"` (the
            default, `defaults.POLICY`) or `"schedule"`.
        c: Float > 0, the batch target as a multiple of B_simple. Defaults
            to `4.0` (`defaults.NOISE_SCALE_MULTIPLE`).
        schedule: For `"schedule"` only: a list of `(epoch, batch)`, epochs
            increasing from 0, batches non-decreasing multiples of
            `batch_size`, at least `batch_size * k0` (any multiple: a
            linear ramp, as Megatron-LM's `--rampup-batch-size`).
        learning_rate_rule: A name in `rules.RULES`: `"auto"` (the default,
            `defaults.LEARNING_RATE_RULE`), `"sqrt"`, `"unchanged"`,
            `"adascale"` or `"linear"`.
        start_multiple: Int, a power of 2 >= 1: the smallest update batch
            from the first epoch, as a multiple of the compiled one
            (`batch_size * k0`). Defaults to `defaults.START_MULTIPLE` (4)
            for a policy without a schedule; must be 1 (its default) for
            one with a schedule, which gives the batches itself.
        anneal_fraction: Float in [0, 1): the share of `fit`'s epochs at
            its end over which the batch is at most `anneal_multiple` times
            the compiled one (0: none). Defaults to
            `defaults.ANNEAL_FRACTION` (0.0) for a policy
            without a schedule; must be 0 (its default) for one with a
            schedule.
        anneal_multiple: Int, a power of 2 >= 1: that largest batch, as a
            multiple of the compiled one. Defaults to
            `defaults.ANNEAL_MULTIPLE` (4).
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

    def __init__(self, batch_size, max_batch_size=None,
                 policy=defaults.POLICY, c=defaults.NOISE_SCALE_MULTIPLE,
                 schedule=None, learning_rate_rule=defaults.LEARNING_RATE_RULE,
                 beta=None, interval=None, start_multiple=None,
                 anneal_fraction=None,
                 anneal_multiple=defaults.ANNEAL_MULTIPLE):
        super().__init__()
        settings = batches.resolve(batches.Settings(
            batch_size, max_batch_size, policy, c, schedule,
            learning_rate_rule, start_multiple, anneal_fraction,
            anneal_multiple))
        if beta is not None:
            check_number("beta", beta, lambda x: 0 <= x < 1, "in [0, 1)")
        if interval is not None:
            check_int("interval", interval, 1)
        self.settings = settings
        self.batch_size = batch_size
        self.max_batch_size = settings.max_batch_size  # None: `set_model`'s
        self.given_max_batch_size = settings.max_batch_size
        self.start_multiple = settings.start_multiple
        self.anneal_fraction = settings.anneal_fraction
        self.anneal_multiple = anneal_multiple
        self.policy = policy
        self.c = float(c)
        self.schedule = settings.schedule
        self.learning_rate_rule = learning_rate_rule
        self.beta = beta
        self.interval = interval
        self.state = None
        self._resumed = None

    def set_model(self, model):
        super().set_model(model)
        self.state = noise_scale.wrap_optimizer(model, self.beta,
                                                self.interval)
        self.max_batch_size = batches.check_compiled(
            self.settings, self.state.initial_accumulation_steps)
        in_effect.reset(self.state)

    @property
    def accumulation_steps(self):
        """The k in effect: micro-batches per update."""
        return in_effect.steps(self.state)

    @property
    def global_batch_size(self):
        """The update batch in effect, `batch_size * k`."""
        return self.batch_size * self.accumulation_steps

    def resume_within_epoch(self, pending):
        """A run restored within an epoch: the next epoch to begin keeps
        the decision it took before the checkpoint (`pending`, the k
        waiting for its micro-batch then, or None) rather than deciding
        again from the statistics since (`train.checkpointing.within_epoch`)."""
        self._resumed = (pending,)

    def on_epoch_begin(self, epoch, logs=None):
        if in_effect.restore_saved(self.state):
            self.model.make_train_function(force=True)
        if self._resumed is not None:
            (pending,), self._resumed = self._resumed, None
            if pending and in_effect.ask(self.state, pending, shrink=True):
                self._switch_when_aligned(0)
            return
        annealing = self._annealing(epoch)
        k = self._decide(epoch)
        if annealing:  # Never shrinks but to the cap.
            k = min(max(k, self.accumulation_steps),
                    self.state.initial_accumulation_steps
                    * self.anneal_multiple)
        if in_effect.ask(self.state, k, shrink=annealing):
            self._switch_when_aligned(0)

    def on_train_batch_begin(self, batch, logs=None):
        if (self.state.pending_accumulation_steps is not None
                and batch >= self._check_at):
            self._switch_when_aligned(batch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs["global_batch_size"] = self.global_batch_size
        logs["updates"] = int(ops.convert_to_numpy(self.state.updates))
        logs.update(self.state.result(self.batch_size))

    def _annealing(self, epoch):
        """Whether `epoch` (0-based) is one of the last
        `floor(anneal_fraction * epochs + 0.5)` of this `fit` (a half
        rounds up)."""
        epochs = (self.params or {}).get("epochs")
        if not self.anneal_fraction or not epochs:
            return False
        last = math.floor(self.anneal_fraction * epochs + 0.5)
        return epoch >= epochs - last

    def _b_simple(self):
        return self.state.result(self.batch_size)["gradient_noise_scale"]

    def _decide(self, epoch):
        """The k this epoch's start asks for (before never-shrink)."""
        policy = policies.POLICIES[self.policy]
        k0 = self.state.initial_accumulation_steps
        largest = batches.largest_accumulation_steps(
            self.batch_size, k0, self.max_batch_size, policy.takes_schedule)
        b_simple = (self._b_simple() if policy.reads_noise_scale
                    else float("nan"))
        k = policy.accumulation_steps(policies.Inputs(
            epoch, self.batch_size, k0, self.c, self.schedule, b_simple))
        return min(max(k, k0 * self.start_multiple), largest)

    def _switch_when_aligned(self, batch):
        """Switches to the pending k if the next micro-batch starts an
        update of it; else reads the counter again when it will."""
        # On JAX `self.model` syncs the state, so the counter is current.
        counter = noise_scale.accumulating_optimizer(
            self.model.optimizer)._iterations
        left = in_effect.micro_batches_to_switch(
            self.state, int(ops.convert_to_numpy(counter)))
        if left == 0:
            k = self.state.pending_accumulation_steps
            in_effect.put_into_effect(self.state, k, self._factor(k))
            self.model.make_train_function(force=True)
        else:
            # When to read the counter next, not state: found again from it.
            self._check_at = batch + left

    def resolved_rule(self):
        """The name of the rule `learning_rate_rule` applies to the
        compiled optimizer (`"auto"` resolved)."""
        return self._rule().name

    def _rule(self):
        return rules.RULES[self.learning_rate_rule].resolve(
            noise_scale.accumulating_optimizer(self.state))

    def _factor(self, k):
        """The rate factor of `learning_rate_rule` at k."""
        rule = self._rule()
        k0 = self.state.initial_accumulation_steps
        ratio = (self._b_simple() / (self.batch_size * k0)
                 if rule.reads_noise_scale else float("nan"))
        return rule.factor(k / k0, ratio)

    def get_config(self):
        return {
            "batch_size": self.batch_size,
            "max_batch_size": self.given_max_batch_size,
            "policy": self.policy,
            "c": self.c,
            "schedule": self.schedule,
            "learning_rate_rule": self.learning_rate_rule,
            "beta": self.beta,
            "interval": self.interval,
            "start_multiple": self.start_multiple,
            "anneal_fraction": self.anneal_fraction,
            "anneal_multiple": self.anneal_multiple,
        }
