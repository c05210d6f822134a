"""Native pack/unpack ops for tensor fusion, with a pure-TensorFlow fallback.

`pack` flattens N gradients into one 1-D buffer (optionally cast and scaled)
so that one collective moves them all; `unpack` is its inverse. Element by
element, with `c` the compute type (float64 when both the source and the
destination are float64, float32 otherwise):

```
y = cast(dtype, cast(c, x) * cast(c, float32(scale)))    # scale != 1
y = cast(dtype, cast(c, x))            # scale == 1 (a copy for equal dtypes)
```

Every cast rounds to nearest, ties to even, as `tf.cast` does for float16
and bfloat16, so the native kernels (`native/`) and the fallback (`tf.reshape`,
`tf.cast`, `tf.concat`, `tf.split`) agree bit for bit. Like every TensorFlow
CPU kernel, both run with float32 subnormals flushed to zero (FTZ/DAZ) in the
multiply and in float32 <-> float64 casts; there is no multiply by 1.

The library `_lb_fusion_ops.so` is built by `pip install .` when TensorFlow is
installed and loaded once; when it is missing or fails to load (for example,
built for another TensorFlow), one warning is logged and the fallback runs.
Set `KERAS_LARGEBATCH_NATIVE=0` (or pass `use_native=False`) to force it;
inside `tf.function(jit_compile=True)` the fallback runs too, since XLA has no
kernel for the native ops.

References:
  - Jia et al. 2018, "Highly Scalable Deep Learning Training System with
    Mixed-Precision: Training ImageNet in Four Minutes", arXiv:1807.11205
    (tensor fusion, fp16 transport).
  - Sergeev & Del Balso 2018, "Horovod", arXiv:1802.05799 (fusion buffer).
"""

import logging
import os
import re
import threading

import numpy as np
import tensorflow as tf

from keras_largebatch import _tf_internals
from keras_largebatch._shared import require

LIBRARY_NAME = "_lb_fusion_ops.so"
SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

_logger = logging.getLogger(__name__)
_lock = threading.Lock()
_state = {"loaded": False, "lib": None, "error": None}


def library_path():
    """Where the native library is expected (beside this module)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def built_for_tensorflow(path=None):
    """The TensorFlow version the library was compiled against, or None.

    Read from a marker string in the binary, so it works when loading fails.
    """
    path = path or library_path()
    try:
        with open(path, "rb") as f:
            match = re.search(rb"LB_BUILT_FOR_TF=([0-9A-Za-z.\-+]+);", f.read())
    except OSError:
        return None
    return match.group(1).decode() if match else None


def _load():
    with _lock:
        if _state["loaded"]:
            return _state["lib"]
        _state["loaded"] = True
        path = library_path()
        if os.environ.get("KERAS_LARGEBATCH_NATIVE", "1") == "0":
            _state["error"] = "disabled by KERAS_LARGEBATCH_NATIVE=0"
            return None
        if not os.path.exists(path):
            _state["error"] = f"{path} not found"
            _logger.warning(
                "keras_largebatch native fusion ops are not built (%s is "
                "missing); using the pure-TensorFlow fallback. Reinstall with "
                "TensorFlow %s present (`pip install .`) to build them.",
                path,
                tf.__version__,
            )
            return None
        try:
            _state["lib"] = tf.load_op_library(path)
            _register_gradients()
        except Exception as e:  # NotFoundError, OSError: bad ABI or symbols.
            _state["error"] = str(e)
            _logger.warning(
                "keras_largebatch native fusion ops failed to load: the "
                "library %s was built for TensorFlow %s, running TensorFlow "
                "is %s. Using the pure-TensorFlow fallback; reinstall "
                "keras-largebatch to rebuild. Error: %s",
                path,
                built_for_tensorflow(path) or "<unknown>",
                tf.__version__,
                e,
            )
        return _state["lib"]


def _register_gradients():
    """Gradients of the native ops, written with the fallback's TF ops."""

    def pack_grad(op, dy):
        inputs, scale = op.inputs[:-1], op.inputs[-1]
        if not inputs:
            return [None]
        sizes = tf.stack([tf.size(x, out_type=tf.int64) for x in inputs])
        parts = tf.split(dy, sizes, num=len(inputs))
        grads = [
            _convert(tf.reshape(p, tf.shape(x)), x.dtype, scale, False)
            for p, x in zip(parts, inputs)
        ]
        return grads + [None]

    def unpack_grad(op, *dys):
        packed, scale = op.inputs
        parts = [
            tf.zeros_like(y) if dy is None else dy
            for y, dy in zip(op.outputs, dys)
        ]
        flat = [
            _convert(tf.reshape(p, [-1]), packed.dtype, scale, False)
            for p in parts
        ]
        return [tf.concat(flat + [tf.zeros([0], packed.dtype)], 0), None]

    for name, fn in (("LbFusionPack", pack_grad), ("LbFusionUnpack", unpack_grad)):
        try:
            tf.RegisterGradient(name)(fn)
        except KeyError:  # Already registered by an earlier load.
            pass


def native_ops_available():
    """Whether the native pack/unpack library is loaded."""
    return _load() is not None


def load_error():
    """Why the native library is not used, or None when it is."""
    _load()
    return _state["error"]


def _lib_or_none(use_native):
    if use_native is False:
        return None
    lib = _load()
    if use_native and lib is None:
        raise RuntimeError(
            "`use_native=True` but the native library is not available: "
            f"{_state['error']}"
        )
    # XLA (`jit_compile=True`) has no kernel for the native ops.
    if _tf_internals.in_xla_context():
        if use_native:
            raise RuntimeError(
                "`use_native=True` inside an XLA-compiled function; the "
                "native ops have no XLA kernel. Use use_native=None or False."
            )
        return None
    return lib


def _check_dtype(dtype, name):
    dtype = tf.as_dtype(dtype)
    require(
        dtype in SUPPORTED_DTYPES, name, dtype.name,
        "one of float16, bfloat16, float32, float64",
    )
    return dtype


def _scale(scale):
    """Returns (float32 scale tensor, True/False if statically 1 or not/None)."""
    if isinstance(scale, (int, float, np.floating, np.integer)):
        value = np.float32(scale)
        return tf.constant(value, tf.float32), bool(value == 1.0)
    scale = tf.convert_to_tensor(scale)
    if scale.shape.rank not in (None, 0):
        raise ValueError(
            f"`scale` must be a scalar. Received: scale with shape {scale.shape}"
        )
    return tf.cast(scale, tf.float32), None


def _fallback(fn, scale, unit_scale):
    """Runs fn(unit_scale); a scale known only at run time picks via tf.cond,
    as the kernels do, since x * 1 flushes subnormals on CPU."""
    if unit_scale is not None:
        return fn(unit_scale)
    return tf.cond(
        tf.equal(scale, 1.0), lambda: fn(True), lambda: fn(False)
    )


def _convert(x, dtype, scale, unit_scale):
    if x.dtype == dtype and unit_scale:
        return x
    compute = tf.float64 if x.dtype == dtype == tf.float64 else tf.float32
    y = tf.cast(x, compute)
    if not unit_scale:
        y = y * tf.cast(scale, compute)
    return tf.cast(y, dtype)


def pack(tensors, dtype=None, scale=1.0, use_native=None):
    """Flattens `tensors` into one 1-D buffer of `dtype`, scaled by `scale`.

    Args:
        tensors: list of float tensors (float16, bfloat16, float32, float64),
            any shapes, dtypes may differ.
        dtype: buffer dtype; defaults to the first tensor's dtype. Required
            when `tensors` is empty.
        scale: float32 scalar (Python number or tensor) multiplied in.
        use_native: None picks the native op when loaded, False forces the
            fallback, True requires the native op.

    Returns:
        A 1-D tensor with `sum(size(t))` elements, tensors in order.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for t in tensors:
        _check_dtype(t.dtype, "tensors")
    if dtype is None:
        if not tensors:
            raise ValueError(
                "`dtype` is required when `tensors` is empty. "
                "Received: tensors=[], dtype=None"
            )
        dtype = tensors[0].dtype
    dtype = _check_dtype(dtype, "dtype")
    scale_t, unit_scale = _scale(scale)
    lib = _lib_or_none(use_native)
    if lib is not None:
        return lib.lb_fusion_pack(tensors, scale_t, out_type=dtype)
    if not tensors:
        return tf.zeros([0], dtype)

    def fn(unit):
        flat = [_convert(tf.reshape(t, [-1]), dtype, scale_t, unit) for t in tensors]
        return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)

    return _fallback(fn, scale_t, unit_scale)


def _check_shapes(shapes):
    result = []
    for shape in shapes:
        shape = tf.TensorShape(shape)
        if not shape.is_fully_defined():
            raise ValueError(
                "`shapes` must be fully defined. "
                f"Received: shapes containing {shape}"
            )
        result.append(shape)
    return result


def _check_size(buffer, total):
    message = (
        "`buffer` size must equal the sum of the sizes of `shapes`. "
        f"Received: buffer with shape {buffer.shape}, sum of sizes {total}"
    )
    if buffer.shape.is_fully_defined():
        if buffer.shape[0] != total:
            raise tf.errors.InvalidArgumentError(None, None, message)
        return buffer
    check = tf.debugging.assert_equal(
        tf.size(buffer, out_type=tf.int64), tf.constant(total, tf.int64),
        message=message,
    )
    with tf.control_dependencies([check]):
        return tf.identity(buffer)


def unpack(buffer, shapes, dtypes, scale=1.0, use_native=None):
    """Splits a 1-D `buffer` into tensors of `shapes` and `dtypes`.

    The inverse of `pack`: slice `i` is reshaped to `shapes[i]` and converted
    to `dtypes[i]` with `scale` multiplied in. A buffer whose size is not the
    sum of the shapes' sizes raises `tf.errors.InvalidArgumentError`.

    Args:
        buffer: 1-D float tensor.
        shapes: list of fully defined shapes.
        dtypes: list of dtypes, one per shape (or a single dtype for all).
        scale: float32 scalar (Python number or tensor) multiplied in.
        use_native: None picks the native op when loaded, False forces the
            fallback, True requires the native op.

    Returns:
        A list of `len(shapes)` tensors.
    """
    buffer = tf.convert_to_tensor(buffer)
    _check_dtype(buffer.dtype, "buffer")
    if buffer.shape.rank not in (None, 1):
        raise ValueError(
            f"`buffer` must be 1-D. Received: buffer with shape {buffer.shape}"
        )
    shapes = _check_shapes(shapes)
    if isinstance(dtypes, (list, tuple)):
        dtypes = [_check_dtype(d, "dtypes") for d in dtypes]
    else:
        dtypes = [_check_dtype(dtypes, "dtypes")] * len(shapes)
    if len(dtypes) != len(shapes):
        raise ValueError(
            "`dtypes` and `shapes` must have the same length. Received: "
            f"len(shapes)={len(shapes)}, len(dtypes)={len(dtypes)}"
        )
    scale_t, unit_scale = _scale(scale)
    lib = _lib_or_none(use_native)
    if not shapes:  # An op without outputs would never run: check here.
        _check_size(buffer, 0)
        return []
    if lib is not None:
        return list(
            lib.lb_fusion_unpack(buffer, scale_t, Tout=dtypes, shapes=shapes)
        )
    sizes = [s.num_elements() for s in shapes]
    buffer = _check_size(buffer, sum(sizes))
    parts = tf.split(buffer, sizes, axis=0) if len(sizes) > 1 else [buffer]

    def fn(unit):
        return [
            _convert(tf.reshape(p, s), d, scale_t, unit)
            for p, s, d in zip(parts, shapes, dtypes)
        ]

    return list(_fallback(fn, scale_t, unit_scale))
