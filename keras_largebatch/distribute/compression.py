"""Gradient compression for the all-reduce, after Horovod's `compression.py`.

A compressor says how a buffer travels. `FP16Compressor` sends float32 as
float16, pre-scaled by `1 / group_size` so that the sum of `group_size`
contributions cannot overflow where each contribution alone would not:

```python
wire = float16(x / n)          # |x| <= 65504 on each of the n workers
total = all_reduce_sum(wire)   # |total| <= max |x| <= 65504: no overflow
sum = float32(total) * n       # back in float32
```

Pre-scaling moves the risk from overflow to underflow: values below
`n * 6e-8` are flushed to zero. With loss scaling (`LARSMixed`) the
gradients that reach the all-reduce are already unscaled; such tiny values
carry no useful update.

References:
    - Jia et al., 2018, arXiv:1807.11205 (FP16 transport of gradients).
    - Sergeev & Del Balso, 2018, "Horovod", arXiv:1802.05799.
"""

import tensorflow as tf


class Compressor:
    """Interface: `compress` before the all-reduce, `decompress` after."""

    name = None

    @staticmethod
    def wire_dtype(dtype):
        """The dtype a buffer of `dtype` travels in."""
        return tf.as_dtype(dtype)

    @staticmethod
    def prescale(dtype, group_size):
        """The factor applied before sending a buffer of `dtype`."""
        return 1.0

    @classmethod
    def compress(cls, tensor, group_size=1):
        """Returns `(wire_tensor, context)`; `context` feeds `decompress`."""
        dtype = tensor.dtype
        scale = cls.prescale(dtype, group_size)
        wire = cls.wire_dtype(dtype)
        if wire == dtype and scale == 1.0:
            return tensor, (dtype, 1.0)
        x = tf.cast(tensor, tf.float32) * scale
        return tf.cast(x, wire), (dtype, scale)

    @staticmethod
    def decompress(tensor, context):
        """Inverse of `compress` applied to an all-reduced `tensor`."""
        dtype, scale = context
        if tensor.dtype == dtype and scale == 1.0:
            return tensor
        return tf.cast(tf.cast(tensor, tf.float32) * (1.0 / scale), dtype)


class NoneCompressor(Compressor):
    """Sends buffers as they are."""

    name = "none"


class FP16Compressor(Compressor):
    """Sends float32 buffers as float16, pre-scaled by `1 / group_size`."""

    name = "fp16"

    @staticmethod
    def wire_dtype(dtype):
        dtype = tf.as_dtype(dtype)
        return tf.float16 if dtype == tf.float32 else dtype

    @staticmethod
    def prescale(dtype, group_size):
        if tf.as_dtype(dtype) != tf.float32:
            return 1.0
        return 1.0 / group_size


class Compression:
    """Namespace of the available compressors (as in Horovod)."""

    none = NoneCompressor
    fp16 = FP16Compressor


def get(identifier):
    """Returns the compressor class for `None`, `"none"`, `"fp16"` or a class."""
    if identifier is None or identifier == "none":
        return NoneCompressor
    if identifier == "fp16":
        return FP16Compressor
    if isinstance(identifier, type) and issubclass(identifier, Compressor):
        return identifier
    raise ValueError(
        "`compression` must be None, 'none', 'fp16' or a `Compressor` "
        f"subclass. Received: compression={identifier!r}"
    )
