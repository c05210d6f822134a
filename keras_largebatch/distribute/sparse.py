"""Top-k sparsified all-reduce with error feedback (Shi et al. 2020).

Per fusion bucket `x` (the flat gradient buffer of one worker), with its
residual `r` (what earlier steps did not send), density `d` and `p` peers:

```python
acc = x + r                              # error feedback
k = ceil(d * size(acc))                  # at least 1
idx = top_k(|acc|, k)                    # exact, or MSTopK on large buckets
sent = (acc[idx], idx)                   # 2k numbers
everyone = all_gather(sent)              # p * 2k numbers, one collective
y = scatter_add(zeros_like(acc), everyone)   # the sparse sum
r = acc; r[idx] = 0                      # residual + sent == acc, exactly
```

Values travel as float32 and indices as their int32 bits in the same
float32 buffer, so one all-gather moves `2 k p` numbers (the cost model's
`sparse_allgather_time`). A bucket whose accumulated values are not all
finite (an overflow under `LARSMixed`: the step is skipped and the loss
scale halved) sends NaNs, so that every peer's sum shows the overflow, and
starts its residual again from zero: an inf never lives on in it.

Selection (`select`): `tf.math.top_k` on buckets of at most
`exact_max_elements` values; above that MSTopK (Shi et al. 2020, Alg. 2),
a bisection for a threshold between `mean(|acc|)` and `max(|acc|)` over
`iterations` counts, then the `k1 <= k` values above the lower-count
threshold plus the first `k - k1` (in index order) of the band between the
two thresholds. It is `O(iterations * n)` with static shapes (XLA compiles
it) and misses only values inside that band, whose width is
`(max - mean) / 2**iterations`.

This module holds the maths and `Residuals`; `topk.TopKReducer` runs the
exchange, owns the residuals and checkpoints them.

References:
    - Shi, Zhou, Song et al., 2020, "Towards Scalable Distributed Training
      of Deep Learning on Public Cloud Clusters", arXiv:2010.10458 (MSTopK,
      hierarchical top-k all-reduce with error feedback).
    - Lin et al., 2018, "Deep Gradient Compression", arXiv:1712.01887
      (residual accumulation).
"""

import hashlib
import math

import tensorflow as tf

from keras_largebatch import _tf_internals
from keras_largebatch.distribute.config import ReduceConfig

# Plain graph code (no Python control flow on tensors): AutoGraph, which
# converts what a `tf.function` calls, is kept out.
_no_autograph = tf.autograph.experimental.do_not_convert

# Buckets of at most this many values use the exact `tf.math.top_k`.
EXACT_MAX_ELEMENTS = ReduceConfig.topk_exact_max_elements
# Bisection steps of MSTopK's threshold search.
ITERATIONS = 20


def num_selected(size, density):
    """`k`: how many of `size` values a bucket sends, at least 1."""
    return min(size, max(1, int(math.ceil(density * size))))


@_no_autograph
def select(x, k, exact_max_elements=EXACT_MAX_ELEMENTS, iterations=ITERATIONS):
    """Indices (int32, shape `[k]`) of `k` large-magnitude entries of `x`.

    Exact top-k when `x` has at most `exact_max_elements` entries, MSTopK
    otherwise (see the module docstring). `x` is 1-D with a static size.
    """
    n = int(x.shape[0])
    a = tf.abs(tf.cast(x, tf.float32))
    # Selection in finite arithmetic: an inf or a NaN (see `sparsify`)
    # would make the thresholds NaN.
    a = tf.where(tf.math.is_finite(a), a, tf.zeros_like(a))
    if n <= exact_max_elements or k >= n:
        return tf.math.top_k(a, k, sorted=False).indices
    k64 = tf.constant(k, tf.int64)
    mean, top = tf.reduce_mean(a), tf.reduce_max(a)
    lo, hi = tf.constant(0.0), tf.constant(1.0)
    # (count, threshold) of the best counts found at or below k (k1, t1)
    # and above k (k2, t2); t1 = inf selects nothing, t2 = 0 everything.
    k1, t1 = tf.constant(0, tf.int64), tf.constant(math.inf)
    k2, t2 = tf.constant(n, tf.int64), tf.constant(0.0)
    for _ in range(iterations):
        ratio = lo + (hi - lo) / 2
        threshold = mean + ratio * (top - mean)
        count = tf.math.count_nonzero(a >= threshold, dtype=tf.int64)
        at_most = count <= k64
        hi = tf.where(at_most, ratio, hi)
        lo = tf.where(at_most, lo, ratio)
        better1 = at_most & (count > k1)
        k1, t1 = tf.where(better1, count, k1), tf.where(better1, threshold, t1)
        better2 = ~at_most & (count < k2)
        k2, t2 = tf.where(better2, count, k2), tf.where(better2, threshold, t2)
    above = a >= t1                                   # k1 entries
    band = (a < t1) & (a >= t2)                       # k2 - k1 >= k - k1
    band_rank = tf.cumsum(tf.cast(band, tf.int64))    # 1, 2, ... in the band
    chosen = above | (band & (band_rank <= k64 - k1))  # exactly k entries
    slot = tf.cumsum(tf.cast(chosen, tf.int32)) - 1
    slot = tf.where(chosen, slot, k)                  # k: a discarded segment
    positions = tf.range(n, dtype=tf.int32)
    return tf.math.unsorted_segment_max(positions, slot, k + 1)[:k]


@_no_autograph
def sparsify(acc, k, exact_max_elements=EXACT_MAX_ELEMENTS,
             iterations=ITERATIONS):
    """`(values, indices, remainder)` of a flat buffer `acc`.

    `values = acc[indices]`; `remainder` is `acc` with those entries set to
    zero, so `remainder + scatter(indices, values) == acc` exactly. When
    `acc` holds an inf or a NaN, the values sent are all NaN (so that every
    peer's sum shows the overflow, as a dense all-reduce would, and
    `LARSMixed` skips the step everywhere) and the remainder is all zeros.
    """
    indices = select(acc, k, exact_max_elements, iterations)
    values = tf.gather(acc, indices)
    remainder = tf.tensor_scatter_nd_update(
        acc, indices[:, None], tf.zeros_like(values)
    )
    finite = tf.reduce_all(tf.math.is_finite(acc))
    values = tf.where(finite, values, tf.fill(tf.shape(values), math.nan))
    remainder = tf.where(finite, remainder, tf.zeros_like(remainder))
    return values, indices, remainder


@_no_autograph
def encode(values, indices):
    """One float32 buffer `[2k]`: the values, then the indices' bits."""
    return tf.concat(
        [tf.cast(values, tf.float32), tf.bitcast(indices, tf.float32)], 0
    )


@_no_autograph
def decode_sum(gathered, k, size, dtype):
    """The dense sum, of `size` entries, of `p` encoded `[2k]` buffers."""
    pairs = tf.reshape(gathered, [-1, 2 * k])
    values = tf.reshape(pairs[:, :k], [-1])
    indices = tf.reshape(tf.bitcast(pairs[:, k:], tf.int32), [-1, 1])
    # scatter_nd adds the values of repeated indices.
    return tf.cast(tf.scatter_nd(indices, values, [size]), dtype)


class Residuals(tf.Module):
    """The error-feedback residuals of one worker: one variable per gradient.

    A trackable: save it with `tf.train.Checkpoint(residuals=...)`. A
    restore issued before the first step is applied as each residual is
    created (TensorFlow's deferred restoration), so a resumed job starts
    from the residuals it saved. Residuals are per worker (every worker
    holds its own): each worker saves and restores its own file.
    """

    def __init__(self):
        super().__init__(name="topk_residuals")

    @_no_autograph
    def get(self, device, replica_id, signature, index, tensor):
        """The residual of gradient `index` of a gradient list whose
        shapes and dtypes hash to `signature`, created (zeros) on first use."""
        name = f"r{replica_id}_{signature}_{index}"
        variable = getattr(self, name, None)
        if variable is None:
            with tf.init_scope(), tf.device(device):
                # A residual belongs to its worker alone: not mirrored.
                variable = _tf_internals.local_variable(
                    tf.zeros(tensor.shape, tensor.dtype), name
                )
            setattr(self, name, variable)
        return variable


def signature(tensors):
    """A short stable hash of the shapes and dtypes of a gradient list."""
    text = repr([(tuple(t.shape.as_list()), t.dtype.name) for t in tensors])
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def residual_checkpoint_callback(strategy, directory, within=None):
    """A Keras callback that writes this worker's top-k residuals under
    `directory` at every epoch end (and within an epoch where asked) and
    restores the latest, or the folder `within`, at the start of `fit`:
    `strategy.cross_device_ops.topk.checkpoint_callback(directory, within)`
    (see there)."""
    return strategy.cross_device_ops.topk.checkpoint_callback(directory,
                                                              within)
