"""The gradient noise scale, measured during `fit`: how far the batch can grow.

McCandlish et al. (2018) predict the critical batch B_crit, around which
steps S and examples E trade off as `(S/S_min - 1)(E/E_min - 1) = 1`, that
is `S = S_min (1 + B_crit/B)`, by the simple noise scale
`B_simple = tr(Sigma) / |G|^2` (Sigma: the per-example gradient covariance,
G: the true gradient). Under gradient accumulation (k micro-batches of b
examples per update) it needs no extra forward or backward pass: each
micro-batch gradient g_i and their average give, per update (their
Appendix A),

```python
small = mean_i |g_i|^2                  # B_small = b
big = |mean_i g_i|^2                    # B_big = k * b
grad_sq = (B_big * big - B_small * small) / (B_big - B_small)
trace = (small - big) / (1 / B_small - 1 / B_big)
```

Both are unbiased; each is smoothed by a bias-corrected exponential moving
average (as EleutherAI's gpt-neox does) before the ratio is taken:
`B_simple = ema(trace) / ema(grad_sq)`.

The statistics are optimizer state: `NoiseScaleOptimizer` wraps any
optimizer, measures as it applies the gradients and saves the averages
with the optimizer. `GradientNoiseScale` and `AdaptiveBatch` read them.

References:
    - McCandlish et al., 2018, "An Empirical Model of Large-Batch
      Training", arXiv:1812.06162.
"""

import contextlib
import math
from typing import NamedTuple

import keras
from keras import ops

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import layerwise

LOG_NAMES = ("gradient_noise_scale", "gns_grad_sq_norm", "gns_trace_cov")
DEFAULT_BETA = 0.99
DEFAULT_INTERVAL = 1
# GradientNoiseScale's own wrappers measure every MONITOR_INTERVAL-th update:
# at most 3% of a step on bench/micro/noise_scale_cost.py's 3.2M-weight MLP on
# every backend (docs/benchmarks.md); the averages see 1/n of the updates.
MONITOR_INTERVAL = 8


class Statistics(NamedTuple):
    """What a step of `NoiseScaleOptimizer` writes: its variables, or their
    values. `STATISTIC_VARIABLES` holds each variable's name, which is also
    its key in a checkpoint."""

    small_sum: object  # sum of |g_i|^2 over this update's micro-batches
    grad_sq: object  # ema of |G|^2
    trace: object  # ema of tr(Sigma) / batch_size
    samples: object  # measured updates (the emas' bias correction)
    updates: object  # updates taken


STATISTIC_VARIABLES = Statistics(
    small_sum="gns_small_sum", grad_sq="gns_grad_sq", trace="gns_trace",
    samples="gns_samples", updates="updates")


def accumulating_optimizer(optimizer):
    """The optimizer that holds Keras' accumulators and micro-batch counter:
    the innermost of a chain of wrappers (`NoiseScaleOptimizer`,
    `LossScaleOptimizer`, `LARSMixed`, `LAMBMixed`), which is handed
    unscaled gradients."""
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


def find_noise_scale_optimizer(optimizer):
    """The `NoiseScaleOptimizer` in `optimizer`'s chain of wrappers, or
    None."""
    while optimizer is not None:
        if isinstance(optimizer, NoiseScaleOptimizer):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None


def check_measurable(optimizer, strategy=None):
    """Which source measures the noise scale: `"replicas"` or
    `"accumulation"`.

    It needs two batch sizes from one step: several replicas of a
    TensorFlow `tf.distribute` `strategy` (each replica's gradient and the
    reduced one), else gradient accumulation with
    `gradient_accumulation_steps = k >= 2` on `optimizer` (or on its inner
    optimizer; each micro-batch gradient and their average). Under JAX's
    `keras.distribution.DataParallel` the gradient is already global:
    accumulation is the source there.

    Raises:
        ValueError: with neither.
    """
    if _replicas(strategy) > 1:
        return "replicas"
    k = accumulating_optimizer(optimizer).gradient_accumulation_steps
    require(k is not None and k >= 2, "gradient_accumulation_steps", k,
            "an int >= 2 to measure the gradient noise scale (it compares "
            "micro-batch gradients with their average), or train on several "
            "replicas of a TensorFlow strategy")
    return "accumulation"


def _replicas(strategy):
    if keras.backend.backend() != "tensorflow":
        return 1
    return getattr(strategy, "num_replicas_in_sync", 1)


def describe(b_simple, batch_size):
    """One line: the measured B_simple and what it means for `batch_size`.

    With B_crit ~ B_simple, `S/S_min = 1 + B_crit/B` and
    `E/E_min = 1 + B/B_crit` (McCandlish et al., 2018, arXiv:1812.06162).
    """
    check_int("batch_size", batch_size, 1)
    if not (isinstance(b_simple, (int, float)) and math.isfinite(b_simple)
            and b_simple > 0):
        return (f"gradient noise scale: not measured (B_simple={b_simple}): "
                "the estimate of |G|^2 is not positive yet (the gradients "
                "are mostly noise at this batch, or the run is too short)")
    steps = 1 + b_simple / batch_size
    examples = 1 + batch_size / b_simple
    doubled = (1 + b_simple / (2 * batch_size)) / steps
    if batch_size <= b_simple / 2:
        verdict = "room to grow: a bigger batch still cuts steps nearly " \
                  "in proportion"
    elif batch_size < 2 * b_simple:
        verdict = "near the critical batch: a bigger batch trades " \
                  "examples for steps about evenly"
    else:
        verdict = "above the critical batch: extra examples are mostly " \
                  "wasted"
    return (f"gradient noise scale B_simple={b_simple:.0f} at batch "
            f"{batch_size}: steps {steps:.2f}x the minimum, examples "
            f"{examples:.2f}x (S/S_min = 1 + B_crit/B, B_crit ~ B_simple); "
            f"doubling the batch takes {doubled:.0%} of the steps; {verdict}")


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

    Per measured update, with `g_i` the K gradients:

    ```python
    small = mean_i |g_i|^2;  big = |mean_i g_i|^2
    grad_sq = (K * big - small) / (K - 1)          # |G|^2
    trace = (small - big) * b * K / (K - 1)        # tr(Sigma)
    ema = beta * ema + (1 - beta) * value          # each, bias-corrected
    ```

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
        """`(small, big, measured)` for this micro-batch, before it is
        applied: `small` the squared norm of its gradients, `big` that of
        the update's average gradient on an update step (replicas: the mean
        squared norm of the replicas' gradients and that of their mean),
        unscaled; zeros where not measured."""
        acc = accumulating_optimizer(self)
        k = acc.gradient_accumulation_steps or 1
        present = [(g, v) for g, v in zip(grads, variables) if g is not None]
        inverse = ops.divide(1.0, _loss_scale(self.inner_optimizer))
        zero = ops.zeros((), "float32")
        replicas = _replica_count()
        if replicas > 1:
            import tensorflow as tf

            context = tf.distribute.get_replica_context()

            # Every step: a collective inside a `cond` would need a
            # `merge_call` there, which tf.distribute refuses.
            local = [ops.cast(g, "float32") for g, _ in present]
            small = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                       _squared_sum(local))
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
            # Keras divides each replica's loss by n: mean_i |n g_i|^2.
            return (small * (replicas * inverse * inverse),
                    _squared_sum(total) * inverse * inverse,
                    ops.convert_to_tensor(True))
        measured = ops.equal((before // k) % self.interval, 0)
        update = ops.equal((before + 1) % k, 0)

        def average():
            # Keras' accumulators, in the order the chain was built with.
            accumulators = [
                acc._accumulated_gradients[self._get_variable_index(v)]
                for _, v in present]
            return _squared_sum([
                ops.add(ops.multiply(ops.cast(g, "float32"), inverse),
                        ops.cast(a.value, "float32"))
                for (g, _), a in zip(present, accumulators)
            ]) / float(k * k)

        def measure():
            small = _squared_sum([g for g, _ in present]) * inverse * inverse
            return small, ops.cond(update, average, lambda: zero)

        return (*ops.cond(measured, measure, lambda: (zero, zero)), measured)

    def _commit(self, measured, before, after):
        """New values of `statistics`, given the micro-batch counter before
        and after the wrapped optimizer applied this micro-batch (a skipped
        step leaves it unchanged)."""
        small, big, is_measured = measured
        small_sum, grad_sq, trace, samples, updates = Statistics(
            *(v.value for v in self.statistics))
        k = accumulating_optimizer(self).gradient_accumulation_steps or 1
        accepted = ops.not_equal(after, before)
        update = ops.logical_and(accepted, ops.equal(after % k, 0))
        replicas = _replica_count()
        if replicas > 1:  # Each micro-batch is a sample: K = n.
            n = float(replicas)
            mean, sample = small, ops.logical_and(accepted, is_measured)
            new_trace = (mean - big) / (n - 1)  # tr(Sigma) / batch_size
        else:
            n = float(k)
            total = small_sum + small
            mean, sample = total / n, ops.logical_and(update, is_measured)
            small_sum = ops.where(ops.logical_and(accepted, is_measured),
                                  ops.where(update, 0.0, total), small_sum)
            new_trace = (mean - big) * (n / (n - 1))
        new_grad_sq = (n * big - mean) / (n - 1)
        b = self.beta
        grad_sq = ops.where(sample, b * grad_sq + (1 - b) * new_grad_sq,
                            grad_sq)
        trace = ops.where(sample, b * trace + (1 - b) * new_trace, trace)
        samples = ops.where(sample, samples + 1.0, samples)
        updates = ops.where(update, updates + 1, updates)
        return Statistics(small_sum, grad_sq, trace, samples, updates)

    def result(self, batch_size):
        """`{name: value}` for `LOG_NAMES`, bias-corrected, for a global
        micro-batch of `batch_size` examples; NaNs before the first
        measured update."""
        values = Statistics(*(float(ops.convert_to_numpy(v.value))
                              for v in self.statistics))
        grad_sq, trace, samples = values.grad_sq, values.trace, values.samples
        if samples == 0:
            return dict.fromkeys(LOG_NAMES, float("nan"))
        debias = 1 - self.beta ** samples
        grad_sq, trace = grad_sq / debias, trace * batch_size / debias
        ratio = trace / grad_sq if grad_sq else float("nan")
        return dict(zip(LOG_NAMES, (ratio, grad_sq, trace)))

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


def _replica_count():
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


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


@keras_largebatch_export("keras_largebatch.GradientNoiseScale")
class GradientNoiseScale(keras.callbacks.Callback):
    """Logs the gradient noise scale B_simple each epoch, from any `fit`.

    Reads the statistics a `NoiseScaleOptimizer` keeps (see there for the
    sources, replicas or gradient accumulation, and the estimator). If the
    compiled optimizer holds none, `set_model` wraps `model.optimizer` in
    one, which stays: the statistics are then saved with the optimizer and
    go on over later fits.

    At each epoch's end it adds to the logs (history, CSV, TensorBoard; put
    it before those callbacks) `gradient_noise_scale` = ema(trace) /
    ema(grad_sq), `gns_grad_sq_norm` and `gns_trace_cov`.

    Args:
        batch_size: Int >= 1, the global batch of one step of `fit` (one
            micro-batch under accumulation).
        beta: Float in [0, 1), the moving averages' decay, for a wrapper
            this callback creates; `None` (the default) takes the
            compiled `NoiseScaleOptimizer`'s, else `0.99`.
        interval: Int >= 1, measure every `interval`-th update, likewise;
            `None` (the default): the compiled one's, else `8`
            (`MONITOR_INTERVAL`: at most 3% of a step, see
            docs/benchmarks.md; the averages then see 1/8 of the updates,
            so at the same `beta` they span 8 times as many).

    Raises:
        ValueError: in `fit`, without accumulation or replicas, or when
            `beta` or `interval` disagrees with the compiled wrapper's.

    References:
        - McCandlish et al., 2018, "An Empirical Model of Large-Batch
          Training", arXiv:1812.06162 (Appendix A).
    """

    def __init__(self, batch_size, beta=None, interval=None):
        super().__init__()
        check_int("batch_size", batch_size, 1)
        if beta is not None:
            check_number("beta", beta, lambda x: 0 <= x < 1, "in [0, 1)")
            beta = float(beta)
        if interval is not None:
            check_int("interval", interval, 1)
        self.batch_size = batch_size
        self.beta = beta
        self.interval = interval
        self.state = None

    def set_model(self, model):
        super().set_model(model)
        self.state = wrap_optimizer(model, self.beta, self.interval,
                                    default_interval=MONITOR_INTERVAL)
        self.source = check_measurable(
            self.state.inner_optimizer,
            model.distribute_strategy
            if keras.backend.backend() == "tensorflow" else None)

    def result(self):
        """`{name: value}` for the three log names, bias-corrected; NaNs
        before the first measured update."""
        return self.state.result(self.batch_size)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.result())

    def get_config(self):
        return {"batch_size": self.batch_size, "beta": self.beta,
                "interval": self.interval}


def _squared_sum(tensors):
    """The sum of the squares of every element of `tensors`, in float32,
    one read of each (the optimizers' own squared norms, per backend)."""
    tensors = [ops.cast(x, "float32") for x in tensors]
    if keras.backend.backend() == "torch":
        from keras_largebatch.optimizers import torch_foreach

        return ops.sum(torch_foreach.squared_norms(tensors))
    return sum(layerwise.squared_norm(x) for x in tensors)
