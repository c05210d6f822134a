import json
import os
import sys

import keras
import pytest

# Quiet TensorFlow's C++ logging in every backend's run (TF is imported by
# tf.data users under all backends).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with float32 policy, a fixed seed, the default
    (nondeterministic) kernels and no leftovers."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    _default_kernels()
    yield
    _default_kernels()
    keras.config.set_dtype_policy("float32")
    # Without gc.collect(): a tenth of a second a test, and no test needs it.
    keras.backend.clear_session(free_memory=False)


def _default_kernels():
    """Turns torch's and TensorFlow's deterministic-kernels switches off
    where imported and on: a command run in-process with `--deterministic`
    turns them on for the process, and with torch's on every new tensor is
    filled, an op more each, which the layers' op budgets count."""
    torch = sys.modules.get("torch")
    if torch and torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(False)
    if sys.modules.get("tensorflow") is not None:  # None: made unimportable
        from tensorflow.python.framework import config

        if config.is_op_determinism_enabled():
            config.disable_op_determinism()


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


# Where a test runs in the full run (`tests/run.sh`, which sets
# KLB_TEST_ENV to the environment it runs in: "main", with TensorFlow, or
# "no_tf"); a plain `pytest` (KLB_TEST_ENV unset) runs every test it
# collects on the backend it has. The markers (pyproject.toml):
# - `backend_independent`: code that does not vary with the Keras backend
#   (flags, rules, error lines, batch lists, the cost model, the run
#   folder's lock, output formats): runs on `HOME_BACKEND` only.
# - `tensorflow` and `multi_process`: on JAX and torch, a test of
#   `NO_TF_DIRS` runs in the environment without TensorFlow unless it needs
#   TensorFlow installed, or starts several processes; those run in the
#   main environment. Tests of the other folders run in the main one.
HOME_BACKEND = "jax"
NO_TF_DIRS = ("tests/train/", "tests/optimizers/", "tests/layers/",
              "tests/bench/")
# Each test's and file's seconds as last recorded (`tests/durations.py`
# writes it from the junit XML files `tests/run.sh` leaves in test-results/).
DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")


def _where(item, backend, env):
    """Whether `item` runs in this pytest process of the full run."""
    if not env:
        return True
    once = item.get_closest_marker("backend_independent")
    if once and backend != once.kwargs.get("home", HOME_BACKEND):
        return False
    if backend == "tensorflow":
        return env == "main"
    needs_main = bool(item.get_closest_marker("tensorflow")
                      or item.get_closest_marker("multi_process"))
    if not item.nodeid.startswith(NO_TF_DIRS):
        return env == "main"
    return needs_main == (env == "main")


def _recorded():
    try:
        with open(DURATIONS) as f:
            found = json.load(f)
        return found["seconds_per_file"], found["slow_tests"]
    except (OSError, ValueError, KeyError):
        return {}, {}


@pytest.hookimpl(tryfirst=True)  # Before `-m` reads the `slow` marks.
def pytest_collection_modifyitems(config, items):
    """Keeps the tests this environment and backend run (`_where`), marks
    `slow` the tests recorded over `slow_seconds`, then puts the costliest
    files first, by their recorded seconds (a stable sort: every file's
    tests keep their order): tests/run.sh runs two pytest workers a file
    each (`--dist loadfile --no-loadscope-reorder`), so the long files of
    jobs in subprocesses start first and end together instead of one
    worker running the last of them alone."""
    backend = keras.backend.backend()
    env = os.environ.get("KLB_TEST_ENV", "")
    keep, drop = [], []
    for item in items:
        (keep if _where(item, backend, env) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    per_file, slow = _recorded()
    for item in keep:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
    keep.sort(key=lambda item: -per_file.get(item.nodeid.split("::")[0], 0.0))
    items[:] = keep
