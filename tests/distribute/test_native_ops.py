"""The native pack/unpack ops equal the pure-TF fallback bit for bit."""

import logging

import keras
import numpy as np
import pytest

if keras.backend.backend() != "tensorflow":
    pytest.skip("native ops are TensorFlow-only", allow_module_level=True)

import ml_dtypes
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_largebatch.distribute import native

requires_native = pytest.mark.skipif(
    not native.native_ops_available(),
    reason="native library not loaded (`pip install .` with TensorFlow "
    f"present builds it): {native.load_error()}",
)

DTYPES = ["float16", "bfloat16", "float32", "float64"]
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (5, 3), (2, 3, 5, 1), (1023,), (4, 33)]
SCALES = [1.0, 0.125, 1.0 / 3.0, 3e4]
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
         "float32": np.float32, "float64": np.float64}


def bits(x):
    x = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def random_float32(rng, shape):
    """Random float32 bit patterns: subnormals, huge values, exact ties."""
    np.seterr(over="ignore")
    raw = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    x = raw.view(np.float32)
    return np.where(np.isfinite(x), x, np.float32(1.5)).reshape(shape)


def make_tensors(seed, dtypes, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [
        tf.constant(random_float32(rng, s).astype(NUMPY[dtypes[i % len(dtypes)]]))
        for i, s in enumerate(shapes)
    ]


def assert_same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(bits(x), bits(y))


@requires_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_pack_equals_fallback_bit_for_bit(dtype, scale):
    tensors = make_tensors(1, DTYPES)
    got = native.pack(tensors, dtype=dtype, scale=scale, use_native=True)
    want = native.pack(tensors, dtype=dtype, scale=scale, use_native=False)
    assert got.shape == (sum(int(np.prod(s)) for s in SHAPES),)
    assert_same_bits([got], [want])


@requires_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_unpack_equals_fallback_bit_for_bit(dtype, scale):
    buffer = make_tensors(2, [dtype], [(sum(int(np.prod(s)) for s in SHAPES),)])[0]
    dtypes = [DTYPES[i % 4] for i in range(len(SHAPES))]
    got = native.unpack(buffer, SHAPES, dtypes, scale=scale, use_native=True)
    want = native.unpack(buffer, SHAPES, dtypes, scale=scale, use_native=False)
    assert [tuple(g.shape) for g in got] == SHAPES
    assert_same_bits(got, want)


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=requires_native)])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_tensor_scale_gives_the_same_bits_as_python_scale(use_native, scale):
    tensors = make_tensors(6, ["bfloat16", "float32", "float16"])
    want = native.pack(tensors, dtype="float32", scale=scale, use_native=False)
    pack = tf.function(lambda s: native.pack(tensors, dtype="float32", scale=s,
                                             use_native=use_native))
    assert_same_bits([pack(tf.constant(scale))], [want])
    dtypes = [t.dtype for t in tensors]
    back = native.unpack(want, SHAPES, dtypes, scale=tf.constant(1 / scale),
                         use_native=use_native)
    assert_same_bits(back, native.unpack(want, SHAPES, dtypes, scale=1 / scale,
                                         use_native=False))


@requires_native
def test_native_handles_inf_and_nan_like_fallback():
    x = tf.constant([np.inf, -np.inf, np.nan, -0.0, 65520.0, 1e-8], tf.float32)
    for dtype in DTYPES:
        got = native.pack([x], dtype=dtype, scale=0.5, use_native=True)
        want = native.pack([x], dtype=dtype, scale=0.5, use_native=False)
        assert_same_bits([got], [want])


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=requires_native)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrowing_matches_numpy_round_to_nearest_even(use_native, dtype):
    rng = np.random.default_rng(3)
    x = random_float32(rng, (4096,))
    scale = np.float32(0.25)
    product = x * scale
    # TensorFlow's CPU kernels run with denormals flushed to zero (FTZ/DAZ).
    product = np.where(
        np.abs(product) < np.finfo(np.float32).tiny, np.copysign(0, product), product
    ).astype(np.float32)
    with np.errstate(over="ignore"):
        want = product.astype(NUMPY[dtype])
    got = native.pack([tf.constant(x)], dtype=dtype, scale=0.25, use_native=use_native)
    np.testing.assert_array_equal(bits(got), bits(want))
    back = native.unpack(got, [(4096,)], ["float32"], scale=4.0, use_native=use_native)
    np.testing.assert_array_equal(bits(back[0]), bits(want.astype(np.float32) * np.float32(4)))


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=requires_native)])
def test_round_trip_through_a_wider_buffer_is_exact(use_native):
    dtypes = ["float32", "float16", "bfloat16"]
    tensors = make_tensors(4, dtypes)
    buffer = native.pack(tensors, dtype="float32", use_native=use_native)
    back = native.unpack(
        buffer, SHAPES, [t.dtype for t in tensors], use_native=use_native
    )
    assert_same_bits(back, tensors)
    doubles = make_tensors(5, ["float64"])
    buffer = native.pack(doubles, dtype="float64", scale=0.5, use_native=use_native)
    back = native.unpack(buffer, SHAPES, ["float64"] * len(SHAPES), scale=2.0,
                         use_native=use_native)
    assert_same_bits(back, doubles)


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=requires_native)])
def test_empty_list_packs_to_empty_buffer(use_native):
    buffer = native.pack([], dtype="float16", use_native=use_native)
    assert buffer.shape == (0,) and buffer.dtype == tf.float16
    assert native.unpack(buffer, [], [], use_native=use_native) == []
    with pytest.raises(ValueError, match="`dtype` is required"):
        native.pack([], use_native=use_native)


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=requires_native)])
@pytest.mark.parametrize("size", [0, 5, 7])
def test_wrong_buffer_size_raises_invalid_argument(use_native, size):
    buffer = tf.zeros([size])
    with pytest.raises(tf.errors.InvalidArgumentError):
        native.unpack(buffer, [(2, 3)], ["float32"], use_native=use_native)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.function(
            lambda b: native.unpack(b, [(2, 3)], ["float32"], use_native=use_native),
            input_signature=[tf.TensorSpec([None], tf.float32)],
        )(buffer)


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="`tensors`"):
        native.pack([tf.constant([1, 2])])
    with pytest.raises(ValueError, match="`dtype`"):
        native.pack([tf.zeros([2])], dtype="int32")
    with pytest.raises(ValueError, match="same length"):
        native.unpack(tf.zeros([2]), [(2,)], ["float32", "float16"])
    with pytest.raises(ValueError, match="fully defined"):
        native.unpack(tf.zeros([2]), [(None,)], ["float32"])
    with pytest.raises(ValueError, match="`scale`"):
        native.pack([tf.zeros([2])], scale=tf.ones([2]))


@requires_native
def test_raw_op_rejects_bad_input_with_invalid_argument():
    lib = native._load()
    one = tf.constant(1.0)
    with pytest.raises(tf.errors.InvalidArgumentError):
        lib.lb_fusion_unpack(tf.zeros([6]), one, Tout=[tf.float32], shapes=[[2, 3], [1]])
    with pytest.raises(tf.errors.InvalidArgumentError):
        lib.lb_fusion_unpack(tf.zeros([6]), one, Tout=[tf.float32], shapes=[[-1, 6]])
    with pytest.raises(tf.errors.InvalidArgumentError):
        lib.lb_fusion_unpack(tf.zeros([2, 3]), one, Tout=[tf.float32], shapes=[[6]])
    with pytest.raises(tf.errors.InvalidArgumentError):
        lib.lb_fusion_unpack(tf.zeros([6]), tf.ones([2]), Tout=[tf.float32], shapes=[[6]])
    with pytest.raises(tf.errors.InvalidArgumentError):
        lib.lb_fusion_pack([tf.zeros([6])], tf.ones([2]), out_type=tf.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, TypeError)):
        lib.lb_fusion_pack([tf.zeros([6], tf.int32)], one, out_type=tf.float32)


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=requires_native)])
def test_runs_in_tf_function_under_mirrored_strategy(use_native):
    tensors = make_tensors(5, ["float32", "float16"], [(3, 4), (5,), (0,)])
    shapes = [t.shape for t in tensors]
    dtypes = [t.dtype for t in tensors]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

    @tf.function
    def step():
        buffer = native.pack(tensors, dtype="bfloat16", scale=0.5, use_native=use_native)
        return native.unpack(buffer, shapes, dtypes, scale=2.0, use_native=use_native)

    with strategy.scope():
        got = strategy.run(step)
    want = native.unpack(
        native.pack(tensors, dtype="bfloat16", scale=0.5, use_native=False),
        shapes, dtypes, scale=2.0, use_native=False,
    )
    assert_same_bits(got, want)


def test_xla_compiled_function_uses_the_fallback():
    tensors = make_tensors(7, ["float32", "bfloat16"], [(3, 4), (5,)])

    @tf.function(jit_compile=True)
    def round_trip():
        buffer = native.pack(tensors, dtype="float16", scale=0.5)
        return native.unpack(buffer, [(3, 4), (5,)], ["float32", "bfloat16"], scale=2.0)

    want = native.unpack(
        native.pack(tensors, dtype="float16", scale=0.5, use_native=False),
        [(3, 4), (5,)], ["float32", "bfloat16"], scale=2.0, use_native=False,
    )
    assert_same_bits(round_trip(), want)


@requires_native
def test_native_gradients_scale_and_cast_back():
    x = tf.Variable(tf.ones([2, 3]))
    y = tf.Variable(tf.ones([4], tf.float16))
    w = tf.range(10, dtype=tf.float32)
    with tf.GradientTape() as tape:
        buffer = native.pack([x, y], dtype="float32", scale=0.5, use_native=True)
        parts = native.unpack(buffer * w, [(2, 3), (4,)], ["float32"] * 2, scale=2.0)
        loss = tf.reduce_sum(parts[0]) + 3.0 * tf.reduce_sum(parts[1])
    gx, gy = tape.gradient(loss, [x, y])
    np.testing.assert_array_equal(gx.numpy(), np.arange(6).reshape(2, 3))
    assert gy.dtype == tf.float16
    np.testing.assert_array_equal(gy.numpy(), 3.0 * np.arange(6, 10))


def test_failed_load_warns_once_naming_both_versions(tmp_path, monkeypatch, caplog):
    fake = tmp_path / native.LIBRARY_NAME
    fake.write_bytes(b"not an ELF file LB_BUILT_FOR_TF=1.2.3; padding")
    monkeypatch.setattr(native, "library_path", lambda: str(fake))
    monkeypatch.setattr(native, "_state", {"loaded": False, "lib": None, "error": None})
    monkeypatch.delenv("KERAS_LARGEBATCH_NATIVE", raising=False)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert not native.native_ops_available()
        assert not native.native_ops_available()
        out = native.pack([tf.ones([2])], dtype="float16")
    warnings = [r for r in caplog.records if r.name == native.__name__]
    assert len(warnings) == 1
    assert "1.2.3" in warnings[0].getMessage()
    assert tf.__version__ in warnings[0].getMessage()
    np.testing.assert_array_equal(out.numpy(), [1.0, 1.0])


def test_missing_library_warns_once_and_falls_back(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(native, "library_path", lambda: str(tmp_path / "none.so"))
    monkeypatch.setattr(native, "_state", {"loaded": False, "lib": None, "error": None})
    monkeypatch.delenv("KERAS_LARGEBATCH_NATIVE", raising=False)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert not native.native_ops_available()
        out = native.unpack(tf.ones([3]), [(3,)], "float16", scale=2.0)
    warnings = [r for r in caplog.records if r.name == native.__name__]
    assert len(warnings) == 1 and "not built" in warnings[0].getMessage()
    np.testing.assert_array_equal(out[0].numpy(), [2.0, 2.0, 2.0])


def test_environment_variable_forces_fallback(monkeypatch):
    monkeypatch.setattr(native, "_state", {"loaded": False, "lib": None, "error": None})
    monkeypatch.setenv("KERAS_LARGEBATCH_NATIVE", "0")
    assert not native.native_ops_available()
    assert "KERAS_LARGEBATCH_NATIVE" in native.load_error()
    with pytest.raises(RuntimeError, match="use_native=True"):
        native.pack([tf.ones([2])], use_native=True)


@requires_native
@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 6), max_size=4), max_size=6),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=7, max_size=7),
    delta=st.integers(-3, 3),
    scale=st.sampled_from([1.0, 0.5, -3.0]),
)
def test_fuzz_never_crashes_and_matches_fallback(shapes, dtypes, delta, scale):
    shapes = [tuple(s) for s in shapes]
    tensors = make_tensors(len(shapes), dtypes[: len(shapes)] or ["float32"], shapes)
    out_dtype = dtypes[-1]
    packed = native.pack(tensors, dtype=out_dtype, scale=scale, use_native=True)
    assert_same_bits(
        [packed], [native.pack(tensors, dtype=out_dtype, scale=scale, use_native=False)]
    )
    total = packed.shape[0]
    buffer = tf.zeros([max(total + delta, 0)], out_dtype)
    out_dtypes = [t.dtype for t in tensors]
    if total + delta == total:
        back = native.unpack(buffer, shapes, out_dtypes, scale=scale, use_native=True)
        assert [tuple(b.shape) for b in back] == shapes
    elif total + delta >= 0:
        with pytest.raises(tf.errors.InvalidArgumentError):
            native.unpack(buffer, shapes, out_dtypes, use_native=True)
