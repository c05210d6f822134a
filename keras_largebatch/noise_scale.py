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

References:
    - McCandlish et al., 2018, "An Empirical Model of Large-Batch
      Training", arXiv:1812.06162.
"""

import contextlib
import math

import keras
from keras import ops

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.optimizers import layerwise

LOG_NAMES = ("gradient_noise_scale", "gns_grad_sq_norm", "gns_trace_cov")


def accumulating_optimizer(optimizer):
    """The optimizer that holds the accumulators: the inner one of a
    `LossScaleOptimizer` (`LARSMixed`, `LAMBMixed`), which is handed
    unscaled gradients."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None and inner.gradient_accumulation_steps:
        return inner
    return optimizer


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
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    if replicas > 1 and keras.backend.backend() == "tensorflow":
        return "replicas"
    k = accumulating_optimizer(optimizer).gradient_accumulation_steps
    require(k is not None and k >= 2, "gradient_accumulation_steps", k,
            "an int >= 2 to measure the gradient noise scale (it compares "
            "micro-batch gradients with their average), or train on several "
            "replicas of a TensorFlow strategy")
    return "accumulation"


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


@keras_largebatch_export("keras_largebatch.GradientNoiseScale")
class GradientNoiseScale(keras.callbacks.Callback):
    """Logs the gradient noise scale B_simple each epoch, from any `fit`.

    Two sources of K gradients of b examples each (unscaled: loss scaling
    is undone first) and their average, over K * b examples:

    - accumulation (every backend): `gradient_accumulation_steps = k >= 2`
      on the optimizer (Keras' argument; `LARS`, `LARSMixed`, `LAMB`,
      `LAMBMixed`, Keras' optimizers): the k micro-batch gradients, K = k,
      b = `batch_size`;
    - replicas (TensorFlow, a `tf.distribute` strategy with n > 1 replicas,
      e.g. `keras_largebatch.distribute.MultiWorkerMirroredStrategy`; used
      whenever n > 1): each replica's gradient as it enters the all-reduce,
      K = n, b = `batch_size` / n (times k if the optimizer accumulates
      before it reduces; `LARSMixed` and `LAMBMixed` reduce each
      micro-batch). One scalar all-reduce per step is added.

    Per update, with `g_i` the K gradients:

    ```python
    small = mean_i |g_i|^2;  big = |mean_i g_i|^2
    grad_sq = (K * big - small) / (K - 1)         # |G|^2
    trace = (small - big) * b * K / (K - 1)       # tr(Sigma)
    ema = beta * ema + (1 - beta) * value         # each, bias-corrected
    ```

    At each epoch's end it adds to the logs (history, CSV, TensorBoard; put
    it before those callbacks) `gradient_noise_scale` = ema(trace) /
    ema(grad_sq), `gns_grad_sq_norm` and `gns_trace_cov`. The averages run
    over the whole fit.

    How: when `fit` hands it the model, before the train step is traced,
    it adds four scalar variables to the optimizer (so they are optimizer
    state on every backend, JAX's stateless step included) and wraps, on
    the instance, the optimizer's `apply` (accumulation: it reads the
    gradients and Keras' accumulators) or its all-reduce (replicas); the
    wrapper updates the four variables and calls the original. At the end
    of `fit` both are undone (an optimizer saved during `fit` holds the
    four extra variables). Its cost: one more read of each gradient per
    step, and of each accumulator per update.

    Args:
        batch_size: Int >= 1, the global batch of one step of `fit` (one
            micro-batch under accumulation).
        beta: Float in [0, 1), the moving averages' decay. Defaults to
            `0.99`.

    References:
        - McCandlish et al., 2018, "An Empirical Model of Large-Batch
          Training", arXiv:1812.06162 (Appendix A).
    """

    def __init__(self, batch_size, beta=0.99):
        super().__init__()
        check_int("batch_size", batch_size, 1)
        check_number("beta", beta, lambda x: 0 <= x < 1, "in [0, 1)")
        self.batch_size = batch_size
        self.beta = float(beta)
        self._hooked = None

    def set_model(self, model):
        super().set_model(model)
        if self._hooked is None:
            self._install(model)

    def _install(self, model):
        strategy = None
        if keras.backend.backend() == "tensorflow":
            strategy = model.distribute_strategy
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        self.source = check_measurable(model.optimizer, strategy)
        if self.source == "replicas":
            owner, name, hook = _replica_hook(
                model.optimizer, self, strategy.num_replicas_in_sync)
        else:
            owner = accumulating_optimizer(model.optimizer)
            name, hook = "apply", self._accumulation_hook(owner)
        with strategy.scope() if strategy else contextlib.nullcontext():
            self._state = [
                owner.add_variable(
                    shape=(), dtype="float32", initializer="zeros",
                    aggregation="only_first_replica", name=f"gns_{slot}",
                )
                for slot in ("small_sum", "grad_sq", "trace", "updates")
            ]
        setattr(owner, name, hook(getattr(owner, name)))
        self._hooked = (owner, name)
        model.train_function = None  # Traced again, with the hook.

    def _accumulation_hook(self, optimizer):
        k = optimizer.gradient_accumulation_steps

        def hook(apply):
            # `**kwargs`: a mixed wrapper's `gradient_step`; under
            # accumulation it hands unscaled gradients.
            def wrapped(grads, trainable_variables=None, **kwargs):
                variables = trainable_variables or \
                    optimizer._trainable_variables
                # Keras 3's accumulators and raw counter (of micro-batches).
                acc = optimizer._accumulated_gradients
                index = optimizer._get_variable_index
                pairs = [(g, acc[index(v)]) for g, v in zip(grads, variables)
                         if g is not None]
                inverse = 1.0 / (optimizer.loss_scale_factor or 1.0) ** 2
                small = _sq([g for g, _ in pairs]) * inverse
                update = ops.equal((optimizer._iterations + 1) % k, 0)
                # The average, on the update step only (a pure branch).
                big = ops.cond(
                    update,
                    lambda: _sq([ops.add(g, ops.cast(a.value, g.dtype))
                                 for g, a in pairs]) * (inverse / k ** 2),
                    lambda: ops.zeros((), "float32"),
                )
                small_sum = self._state[0]
                small = ops.add(small_sum.value, small)
                small_sum.assign(ops.where(update, 0.0, small))
                self._update(small / k, big, k, self.batch_size, update)
                return apply(grads, trainable_variables, **kwargs)

            return wrapped

        return hook

    def _record_replicas(self, local, reduced, inverse_square, b_small):
        """Replica context: `local` this replica's gradients (of the loss
        Keras divides by n), `reduced` their sum, both times the loss scale
        when `inverse_square` (1 / scale^2) says so."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        n = context.num_replicas_in_sync
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, _sq(local))
        small = total * (n * inverse_square)  # mean_i |n * g_i|^2
        big = _sq(reduced) * inverse_square
        self._update(small, big, n, b_small, True)

    def _update(self, small, big, k, b_small, update):
        _, grad_sq_ema, trace_ema, updates = self._state
        grad_sq = (k * big - small) / (k - 1)
        trace = (small - big) * (b_small * k / (k - 1))
        b = self.beta
        grad_sq_ema.assign(ops.where(
            update, b * grad_sq_ema.value + (1 - b) * grad_sq,
            grad_sq_ema.value))
        trace_ema.assign(ops.where(
            update, b * trace_ema.value + (1 - b) * trace, trace_ema.value))
        updates.assign(ops.where(update, updates.value + 1, updates.value))

    def result(self):
        """`{name: value}` for the three log names, bias-corrected; NaNs
        before the first update."""
        _, grad_sq, trace, updates = [
            float(ops.convert_to_numpy(v.value)) for v in self._state
        ]
        if updates == 0:
            return dict.fromkeys(LOG_NAMES, float("nan"))
        debias = 1 - self.beta ** updates
        grad_sq, trace = grad_sq / debias, trace / debias
        ratio = trace / grad_sq if grad_sq else float("nan")
        return dict(zip(LOG_NAMES, (ratio, grad_sq, trace)))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.result())

    def on_train_end(self, logs=None):
        hooked, self._hooked = self._hooked, None
        if hooked is None:
            return
        owner, name = hooked
        delattr(owner, name)
        # Keras' optimizers keep their variables in `_variables`.
        tracked = owner._variables
        for v in self._state:
            tracked.pop(next(i for i, u in enumerate(tracked) if u is v))
        self.model.train_function = None

    def get_config(self):
        return {"batch_size": self.batch_size, "beta": self.beta}


def _replica_hook(optimizer, callback, replicas):
    """(owner, method name, wrapper) around the all-reduce of gradients:
    `LARSMixed`/`LAMBMixed` reduce loss-scaled gradients in their public
    `all_reduce_scaled_gradients`, each micro-batch; Keras' TensorFlow
    optimizers (the inner one of a `LossScaleOptimizer`, on unscaled
    gradients) in `_all_reduce_sum_gradients`, after accumulation."""
    if hasattr(optimizer, "all_reduce_scaled_gradients"):
        b_small = callback.batch_size / replicas

        def hook(reduce):
            def wrapped(grads):
                reduced = reduce(grads)
                inverse = 1.0 / ops.square(optimizer.dynamic_scale.value)
                callback._record_replicas(
                    [g for g in grads if g is not None],
                    [g for g in reduced if g is not None], inverse, b_small)
                return reduced

            return wrapped

        return optimizer, "all_reduce_scaled_gradients", hook
    owner = getattr(optimizer, "inner_optimizer", optimizer)
    k = owner.gradient_accumulation_steps or 1
    b_small = callback.batch_size * k / replicas

    def hook(reduce):
        def wrapped(grads_and_vars):
            grads_and_vars = list(grads_and_vars)
            reduced = reduce(grads_and_vars)
            callback._record_replicas(
                [g for g, _ in grads_and_vars if g is not None],
                [g for g, _ in reduced if g is not None], 1.0, b_small)
            return reduced

        return wrapped

    return owner, "_all_reduce_sum_gradients", hook


def _sq(tensors):
    """The sum of squares of all `tensors`, in float32, one read of each
    (the optimizers' own squared norms, per backend)."""
    tensors = [ops.cast(x, "float32") for x in tensors]
    if keras.backend.backend() == "torch":
        from keras_largebatch.optimizers import torch_foreach

        return ops.sum(torch_foreach.squared_norms(tensors))
    return sum(layerwise.squared_norm(x) for x in tensors)
