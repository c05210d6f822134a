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


def pytest_report_header(config):
    return f"KERAS_BACKEND={keras.backend.backend()}"
