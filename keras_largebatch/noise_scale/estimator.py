"""The estimator of the gradient noise scale: its statistics and its formula.

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

`measure` (or `measure_replicas`) takes the squared norms of a micro-batch,
`commit` folds them into the `Statistics` and `estimate` reads B_simple
from them. The statistics are the state of `NoiseScaleOptimizer`, which
calls these as it applies the gradients.

References:
    - McCandlish et al., 2018, "An Empirical Model of Large-Batch
      Training", arXiv:1812.06162.
"""

from typing import NamedTuple

import keras
from keras import ops

from keras_largebatch.optimizers.norms import squared_norm

LOG_NAMES = ("gradient_noise_scale", "gns_grad_sq_norm", "gns_trace_cov")
DEFAULT_BETA = 0.99


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


def measure(grads, accumulators, k, interval, before, inverse_scale):
    """`(small, big, measured)` for a micro-batch of gradient accumulation,
    before it is applied: `small` the squared norm of its gradients `grads`,
    `big` that of the update's average gradient on the update's last
    micro-batch, both unscaled (times `inverse_scale`, the inverse of the
    loss scale the gradients carry); zeros where not measured.

    `before` is Keras' micro-batch counter, `k` micro-batches make an
    update, and every `interval`-th update is measured. `accumulators`
    returns Keras' accumulated gradients in the order of `grads`; it is
    called only where the average is taken.
    """
    zero = ops.zeros((), "float32")
    measured = ops.equal((before // k) % interval, 0)
    update = ops.equal((before + 1) % k, 0)

    def average():
        return squared_sum([
            ops.add(ops.multiply(ops.cast(g, "float32"), inverse_scale),
                    ops.cast(a.value, "float32"))
            for g, a in zip(grads, accumulators())
        ]) / float(k * k)

    def norms():
        small = squared_sum(grads) * inverse_scale * inverse_scale
        return small, ops.cond(update, average, lambda: zero)

    return (*ops.cond(measured, norms, lambda: (zero, zero)), measured)


def measure_replicas(grads, replicas, inverse_scale):
    """`(small, big, measured)` for a step on `replicas` replicas of a
    TensorFlow strategy, in a replica context: the mean squared norm of the
    replicas' gradients and that of their mean, unscaled; measured every
    step (a collective inside a `cond` would need a `merge_call` there,
    which tf.distribute refuses)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    local = [ops.cast(g, "float32") for g in grads]
    small = context.all_reduce(tf.distribute.ReduceOp.SUM, squared_sum(local))
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
    # Keras divides each replica's loss by n: mean_i |n g_i|^2.
    return (small * (replicas * inverse_scale * inverse_scale),
            squared_sum(total) * inverse_scale * inverse_scale,
            ops.convert_to_tensor(True))


def commit(statistics, measured, before, after, k, replicas, beta):
    """New values of `statistics` (a `Statistics` of values) after a
    micro-batch `measured` (what `measure` returned), given the micro-batch
    counter `before` and `after` the wrapped optimizer applied it (a skipped
    step leaves it unchanged), `k` micro-batches per update, the number of
    `replicas` and the moving averages' decay `beta`. Per measured update of
    K gradients of b examples each:

    ```python
    small = mean_i |g_i|^2;  big = |mean_i g_i|^2
    grad_sq = (K * big - small) / (K - 1)          # |G|^2
    trace = (small - big) * b * K / (K - 1)        # tr(Sigma)
    ema = beta * ema + (1 - beta) * value          # each, bias-corrected
    ```
    """
    small, big, is_measured = measured
    small_sum = statistics.small_sum
    accepted = ops.not_equal(after, before)
    update = ops.logical_and(accepted, ops.equal(after % k, 0))
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
    return Statistics(
        small_sum=small_sum,
        grad_sq=ops.where(sample, beta * statistics.grad_sq
                          + (1 - beta) * new_grad_sq, statistics.grad_sq),
        trace=ops.where(sample, beta * statistics.trace
                        + (1 - beta) * new_trace, statistics.trace),
        samples=ops.where(sample, statistics.samples + 1.0,
                          statistics.samples),
        updates=ops.where(update, statistics.updates + 1, statistics.updates))


def estimate(statistics, beta, batch_size):
    """`{name: value}` for `LOG_NAMES` from `statistics` (a `Statistics` of
    floats), bias-corrected, for a global micro-batch of `batch_size`
    examples; NaNs before the first measured update."""
    if statistics.samples == 0:
        return dict.fromkeys(LOG_NAMES, float("nan"))
    debias = 1 - beta ** statistics.samples
    grad_sq = statistics.grad_sq / debias
    trace = statistics.trace * batch_size / debias
    ratio = trace / grad_sq if grad_sq else float("nan")
    return dict(zip(LOG_NAMES, (ratio, grad_sq, trace)))


def squared_sum(tensors):
    """The sum of the squares of every element of `tensors`, in float32,
    one read of each (the optimizers' own squared norms, per backend)."""
    tensors = [ops.cast(x, "float32") for x in tensors]
    if keras.backend.backend() == "torch":
        from keras_largebatch.optimizers import torch_foreach

        return ops.sum(torch_foreach.squared_norms(tensors))
    return sum(squared_norm(x) for x in tensors)
