import os

import keras
import pytest

# Quiet TensorFlow's C++ logging in every backend's run (TF is imported by
# tf.data users under all backends).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with float32 policy, a fixed seed, no leftovers."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


def dense_bn_model():
    """Dense + BN + a zero-initialised kernel + a head, with real paths:

        body/kernel body/bias bn/gamma bn/beta zero/kernel zero/bias
        head/kernel head/bias
    """
    inputs = keras.Input((5,))
    x = keras.layers.Dense(6, name="body")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Dense(4, kernel_initializer="zeros", name="zero")(x)
    outputs = keras.layers.Dense(3, name="head")(x)
    return keras.Model(inputs, outputs)


@pytest.fixture(name="dense_bn_model")
def _dense_bn_model_fixture():
    """`dense_bn_model`, the optimizer tests' small model, as a builder."""
    return dense_bn_model


def pytest_report_header(config):
    return f"KERAS_BACKEND={keras.backend.backend()}"
