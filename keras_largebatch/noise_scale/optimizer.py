"""`NoiseScaleOptimizer`: the wrapper that measures the gradient noise scale
as it applies gradients, and keeps the statistics as its saved state.

The estimator (`estimator.py`) says what is measured and how it is
averaged; the sources (`sources.py`), where the gradients come from. This
wrapper sees each micro-batch's gradients on their way to the optimizer it
wraps, hands everything else to that optimizer, and finds or puts itself
on a model (`find_noise_scale_optimizer`, `wrap_optimizer`).
"""

import contextlib

import keras
from keras import ops

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch._wrappers import chain
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.noise_scale import estimator
from keras_largebatch.noise_scale.estimator import DEFAULT_BETA
from keras_largebatch.noise_scale.estimator import STATISTIC_VARIABLES
from keras_largebatch.noise_scale.estimator import Statistics
from keras_largebatch.noise_scale.sources import accumulating_optimizer
from keras_largebatch.noise_scale.sources import check_measurable
from keras_largebatch.noise_scale.sources import replica_count

DEFAULT_INTERVAL = 1


def find_noise_scale_optimizer(optimizer):
    """The `NoiseScaleOptimizer` in `optimizer`'s chain of wrappers, or
    None."""
    return next((o for o in chain(optimizer)
                 if isinstance(o, NoiseScaleOptimizer)), None)


@keras_largebatch_export("keras_largebatch.NoiseScaleOptimizer")
class NoiseScaleOptimizer(keras.optimizers.Optimizer):
    """Wraps an optimizer; measures the gradient noise as it applies gradients.

    Keeps, as its own saved variables, the moving averages from which
    B_simple is read (`result`; `statistics`, a `Statistics`). Everything
    else (`learning_rate`, `iterations`, loss scaling, saving of the
    inner state) is the wrapped optimizer's. Its own variables are saved
    by name; a checkpoint that holds them by position (keras_largebatch
    before the named store) loads too.

    It also holds, for `AdaptiveBatch`, the batch in effect
    (`adaptive_batch/in_effect.py` puts it into effect): the variables
    `accumulation_steps` and `learning_rate_factor`, saved with the
    statistics (every checkpoint of a run has them, in this order), and
    the attributes `pending_accumulation_steps` and `base_learning_rate`,
    found again when a fit starts.

    Two sources of K gradients of b examples each (unscaled: a loss scale
    is undone) and their average, over K * b examples:

    - accumulation (every backend): `gradient_accumulation_steps = k >= 2`
      on the optimizer, or on the inner one of a `LossScaleOptimizer`,
      `LARSMixed`, `LAMBMixed`: the k micro-batch gradients, K = k, and
      Keras' accumulators;
    - replicas (TensorFlow, a `tf.distribute` strategy with n > 1
      replicas; used whenever n > 1): each replica's gradient of the step
      and their sum, K = n, every step. It costs one more all-reduce of
      the gradients per step (twice the gradient traffic of a step without
      it) and a scalar all-reduce: the wrapped optimizer sums the gradients
      out of this wrapper's sight, and `interval` does not apply
      (tf.distribute refuses a collective inside a conditional).

    Each measured update's squared norms are folded into the moving
    averages by `estimator.commit` (the formula is there).

    Only every `interval`-th update is measured (all of its micro-batches),
    as all replicas and processes agree from the update count: the rest
    cost nothing. A skipped step (a non-finite loss-scaled gradient) is not
    measured.

    Compiling with it (`model.compile(NoiseScaleOptimizer(SGD(...)))`) puts
    the statistics in checkpoints from the first save; `GradientNoiseScale`
    and `AdaptiveBatch` wrap `model.optimizer` themselves when it holds no
    `NoiseScaleOptimizer`.

    Args:
        optimizer: The `keras.optimizers.Optimizer` to wrap.
        beta: Float in [0, 1), the moving averages' decay per measured
            update. Defaults to `0.99`.
        interval: Int >= 1, measure every `interval`-th update. Defaults
            to `1`.
        name: Defaults to `None`: `"noise_scale_optimizer"`, ...

    References:
        - McCandlish et al., 2018, "An Empirical Model of Large-Batch
          Training", arXiv:1812.06162 (Appendix A).
    """

    def __init__(self, optimizer, beta=DEFAULT_BETA, interval=DEFAULT_INTERVAL,
                 name=None, **kwargs):
        require(isinstance(optimizer, keras.optimizers.Optimizer)
                and not isinstance(optimizer, NoiseScaleOptimizer),
                "optimizer", optimizer,
                "a keras.optimizers.Optimizer other than a NoiseScaleOptimizer")
        check_number("beta", beta, lambda x: 0 <= x < 1, "in [0, 1)")
        check_int("interval", interval, 1)
        super().__init__(learning_rate=0.0, name=name, **kwargs)
        self.inner_optimizer = optimizer
        self.beta = float(beta)
        self.interval = interval
        # The k the optimizer was compiled with (AdaptiveBatch's start).
        self.initial_accumulation_steps = accumulating_optimizer(
            optimizer).gradient_accumulation_steps
        self.pending_accumulation_steps = None
        self.base_learning_rate = None

    def build(self, var_list):
        if self.built:
            return

        def scalar(name, dtype="float32", value=0.0):
            return self.add_variable(
                shape=(), dtype=dtype, name=name, aggregation="only_first_replica",
                initializer=keras.initializers.Constant(value))

        names = STATISTIC_VARIABLES
        self.small_sum = scalar(names.small_sum)
        self.grad_sq = scalar(names.grad_sq)
        self.trace = scalar(names.trace)
        self.samples = scalar(names.samples)
        self.updates = scalar(names.updates, "int", 0)
        self.accumulation_steps = scalar("accumulation_steps", "int", 0)
        self.learning_rate_factor = scalar("learning_rate_factor", value=1.0)
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def statistics(self):
        """The variables the step writes, a `Statistics`."""
        return Statistics(self.small_sum, self.grad_sq, self.trace,
                          self.samples, self.updates)

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        grads = list(grads)
        variables = list(trainable_variables or self._trainable_variables)
        counter = _counter(self)
        if keras.backend.backend() == "torch" and self._skip_eagerly(
                grads, trainable_variables, counter):
            return
        before = ops.copy(counter.value)  # torch assigns in place.
        measured = self._measure(grads, variables, before)
        self.inner_optimizer.apply(grads, trainable_variables)
        committed = self._commit(measured, before, counter.value)
        for v, x in zip(self.statistics, committed):
            v.assign(x)

    def _skip_eagerly(self, grads, trainable_variables, counter):
        """torch (eager): applies a micro-batch of an update that is not
        measured with one read of the counter (two on the update's last
        micro-batch, to see whether the step was skipped) and at most one
        store, where the traced path runs some forty scalar ops; False
        (nothing done) for a measured one."""
        k = accumulating_optimizer(self).gradient_accumulation_steps or 1
        before = int(ops.convert_to_numpy(counter.value))
        if (before // k) % self.interval == 0:
            return False
        self.inner_optimizer.apply(grads, trainable_variables)
        if (before + 1) % k == 0 and int(
                ops.convert_to_numpy(counter.value)) != before:
            self.updates.assign(self.updates.value + 1)
        return True

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        if not self.built:
            raise ValueError(
                f"To call `stateless_apply`, {type(self).__name__} must be "
                "built (i.e. its variables must have been created). You can "
                "build it via `optimizer.build(trainable_variables)`.")
        own = len(self._variables)
        inner = self.inner_optimizer
        mapping = list(zip(self._trainable_variables, trainable_variables))
        mapping += list(zip(self.variables, optimizer_variables))
        counter = _counter(self)
        at = next(i for i, v in enumerate(inner.variables) if v is counter)
        with keras.StatelessScope(state_mapping=mapping):
            before = counter.value
            measured = self._measure(grads, self._trainable_variables, before)
        trainable, inner_values = inner.stateless_apply(
            optimizer_variables[own:], grads, trainable_variables)
        with keras.StatelessScope(state_mapping=mapping) as scope:
            committed = self._commit(measured, before, inner_values[at])
            for v, x in zip(self.statistics, committed):
                v.assign(x)
            own_values = [scope.get_current_value(v) for v in self._variables]
        return trainable, own_values + list(inner_values)

    def _measure(self, grads, variables, before):
        """`estimator.measure`'s `(small, big, measured)` for this
        micro-batch, before it is applied, from the source in use: the
        replicas of the step, else Keras' accumulators."""
        acc = accumulating_optimizer(self)
        present = [(g, v) for g, v in zip(grads, variables) if g is not None]
        grads = [g for g, _ in present]
        inverse = ops.divide(1.0, _loss_scale(self.inner_optimizer))
        replicas = replica_count()
        if replicas > 1:
            return estimator.measure_replicas(grads, replicas, inverse)

        def accumulators():
            # Keras' accumulators, in the order the chain was built with.
            return [acc._accumulated_gradients[self._get_variable_index(v)]
                    for _, v in present]

        return estimator.measure(
            grads, accumulators, acc.gradient_accumulation_steps or 1,
            self.interval, before, inverse)

    def _commit(self, measured, before, after):
        """New values of `statistics` (`estimator.commit`), given the
        micro-batch counter before and after the wrapped optimizer applied
        this micro-batch."""
        return estimator.commit(
            Statistics(*(v.value for v in self.statistics)), measured,
            before, after,
            accumulating_optimizer(self).gradient_accumulation_steps or 1,
            replica_count(), self.beta)

    def result(self, batch_size):
        """`{name: value}` for `LOG_NAMES`, bias-corrected, for a global
        micro-batch of `batch_size` examples; NaNs before the first
        measured update (`estimator.estimate`)."""
        return estimator.estimate(
            Statistics(*(float(ops.convert_to_numpy(v.value))
                         for v in self.statistics)),
            self.beta, batch_size)

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        # The base constructor sets a rate of its own before the inner exists.
        if "inner_optimizer" not in vars(self):
            keras.optimizers.Optimizer.learning_rate.fset(self, learning_rate)
        else:
            self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list, var_names)

    def save_own_variables(self, store):
        # The inner optimizer's variables are saved under `inner_optimizer/`.
        for variable in self._variables:
            store[variable.name] = ops.convert_to_numpy(variable)

    def load_own_variables(self, store):
        keys = set(store.keys())
        names = [v.name for v in self._variables]
        if keys == set(names):
            for name, variable in zip(names, self._variables):
                variable.assign(store[name])
        elif keys == {str(i) for i in range(len(names))}:
            # Written by position, in the same order, before the keyed store.
            for i, variable in enumerate(self._variables):
                variable.assign(store[str(i)])
        else:
            super().load_own_variables(store)  # Warns and skips.

    def get_config(self):
        return {
            "optimizer": keras.saving.serialize_keras_object(
                self.inner_optimizer),
            "beta": self.beta,
            "interval": self.interval,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["optimizer"] = keras.saving.deserialize_keras_object(
            config["optimizer"], custom_objects=custom_objects)
        return cls(**config)


def _counter(optimizer):
    """Keras' micro-batch counter of the accumulating optimizer."""
    return accumulating_optimizer(optimizer)._iterations


def _loss_scale(optimizer):
    """The factor the gradients `optimizer` receives carry: a loss-scale
    optimizer's dynamic scale, else a fixed `loss_scale_factor`."""
    scale = getattr(optimizer, "dynamic_scale", None)
    if scale is not None:
        return ops.cast(scale.value, "float32")
    factor = accumulating_optimizer(optimizer).loss_scale_factor
    return ops.convert_to_tensor(float(factor or 1.0), "float32")


def wrap_optimizer(model, beta=None, interval=None,
                   default_interval=DEFAULT_INTERVAL):
    """The `NoiseScaleOptimizer` of `model`'s optimizer. When it holds
    none, replaces `model.optimizer` by a new one wrapping it (`beta`,
    `interval`: its arguments; if None, `DEFAULT_BETA` and
    `default_interval`), and drops the train function, traced again with
    the wrapper. An existing one must agree with a `beta` or `interval`
    given."""
    state = find_noise_scale_optimizer(model.optimizer)
    if state is not None:
        for name, value in (("beta", beta), ("interval", interval)):
            require(value is None or value == getattr(state, name), name,
                    value, f"the compiled NoiseScaleOptimizer's "
                    f"({getattr(state, name)}) or None")
        return state
    strategy = None
    if keras.backend.backend() == "tensorflow":
        strategy = model.distribute_strategy
    check_measurable(model.optimizer, strategy)
    with strategy.scope() if strategy else contextlib.nullcontext():
        state = NoiseScaleOptimizer(
            model.optimizer,
            beta=DEFAULT_BETA if beta is None else beta,
            interval=default_interval if interval is None else interval)
        state.build(model.trainable_variables)
    model.optimizer = state
    model.train_function = None
    return state
