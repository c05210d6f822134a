"""`--precision` (`auto`: mixed_float16 on a GPU, float32 elsewhere),
`--deterministic` and `--seed`: `set_up` makes them Keras' global state."""

import keras


def set_up(runtime):
    """Seeds Keras' random generators with `runtime.seed`, makes the
    kernels deterministic under `runtime.deterministic` and sets the dtype
    policy of `runtime.precision`, resolved; returns that policy's name.
    (`runtime` is `RunConfig.runtime`.)"""
    keras.utils.set_random_seed(runtime.seed)
    if runtime.deterministic:
        make_deterministic()
    precision = resolve_precision(runtime.precision)
    keras.mixed_precision.set_dtype_policy(precision)
    return precision


def resolve_precision(precision):
    """`auto` is mixed_float16 on a GPU and float32 elsewhere."""
    if precision != "auto":
        return precision
    return "mixed_float16" if has_gpu() else "float32"


def make_deterministic():
    """Deterministic kernels (what `--deterministic` changes)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    elif backend == "torch":
        import torch

        torch.use_deterministic_algorithms(True)


def has_gpu():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))
