"""Gradient compression for the all-reduce, after Horovod's `compression.py`.

A compressor says which dtype a buffer travels in. `FP16Compressor` sends
float32 as float16, with no pre-scaling of a sum (what optimizers reduce):

```python
wire = float16(g)              # each replica: g = loss_scale * g_local / n
total = all_reduce_sum(wire)   # float16 ring sum
g = float32(total)             # then unscaled in float32 (LARSMixed)
```

Keras divides each replica's loss by the number of replicas `n`, so the
sum is no larger than the largest replica's own gradient: nothing more is
needed against overflow. What float16 costs is precision at the small end:
values below its normal range (6.1e-5) keep fewer than 11 bits, below
6e-8 none. Under `LARSMixed` the gradients on the wire still carry the loss
scale (2**15 by default), which lifts them into the normal range; an
overflow there (an inf in the sum) makes the step skip and the scale halve
on every replica. Without a loss scale (plain `LARS`, SGD) small
gradients lose bits: prefer `LARSMixed` with fp16 transport.

`TopKCompressor` (`compression="topk"`) changes no dtype: its name makes
gradient buckets go to the top-k reducer (`ReduceConfig.topk`,
`topk.TopKReducer`), which sends the largest entries of each bucket and
keeps the rest for the next step.

Use a compressor by name (`compression="fp16"`) or as a class
(`compression=Compression.fp16`) in `MultiWorkerMirroredStrategy`; a
subclass overriding `wire_dtype` defines a new one.

References:
    - Jia et al., 2018, arXiv:1807.11205 (FP16 transport of gradients).
    - Sergeev & Del Balso, 2018, "Horovod", arXiv:1802.05799.
"""

import tensorflow as tf

from keras_largebatch._shared import require


class Compressor:
    """Interface: the dtype a buffer travels in (`all_reduce.wire_format`
    casts to it before the all-reduce and back after)."""

    name = None

    @staticmethod
    def wire_dtype(dtype):
        """The dtype a buffer of `dtype` travels in."""
        return tf.as_dtype(dtype)


class NoneCompressor(Compressor):
    """Sends buffers as they are."""

    name = "none"


class FP16Compressor(Compressor):
    """Sends float32 buffers as float16 (other dtypes as they are)."""

    name = "fp16"

    @staticmethod
    def wire_dtype(dtype):
        dtype = tf.as_dtype(dtype)
        return tf.float16 if dtype == tf.float32 else dtype


class TopKCompressor(Compressor):
    """Sends the top-k entries of each bucket, keeps the rest as a residual.

    Buffers travel in their own dtype, as (value, index) pairs gathered from
    every peer; see `keras_largebatch.distribute.sparse` for the algorithm
    and `MultiWorkerMirroredStrategy(topk_density=...)` for its settings.
    """

    name = "topk"


class Compression:
    """Namespace of the available compressors (as in Horovod)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    topk = TopKCompressor


def get(identifier):
    """The compressor class for `None`, `"none"`, `"fp16"`, `"topk"` or a
    class."""
    if identifier is None or identifier == "none":
        return NoneCompressor
    for builtin in (FP16Compressor, TopKCompressor):
        if identifier == builtin.name:
            return builtin
    require(
        isinstance(identifier, type) and issubclass(identifier, Compressor),
        "compression", identifier,
        "None, 'none', 'fp16', 'topk' or a `Compressor` subclass",
    )
    return identifier


def serialize(compressor):
    """`None` for no compression, the name of a built-in, else the class."""
    compressor = get(compressor)
    if compressor is NoneCompressor:
        return None
    if compressor in (FP16Compressor, TopKCompressor):
        return compressor.name
    return compressor
