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


# The test files that cost the most, the costliest first (seconds of their
# tests on this project's 2-core CPU VM, the dearest backend). tests/run.sh
# runs two pytest workers a file each (`--dist loadfile
# --no-loadscope-reorder`), a worker taking the next file as it ends one:
# started first, the long files of jobs in subprocesses end together instead
# of one worker running the last of them alone. Files not listed keep their
# order, after these.
COSTLIEST_FIRST = (
    "tests/bench/test_gpu_campaign.py",                          # 550 (JAX)
    "tests/train/checkpointing/test_train_step_checkpoints.py",  # 405 (JAX)
    "tests/distribute/test_distribute_topk.py",                  # 300
    "tests/distribute/test_distribute_multiworker.py",           # 270
    "tests/bench/test_study.py",                                 # 250 (JAX)
    "tests/train/run/test_train_processes.py",                   # 205 (JAX)
    "tests/train/run/test_train_adaptive_batch.py",              # 165 (JAX)
    "tests/train/test_train_cli.py",                             # 150
    "tests/train/test_train_without_tensorflow.py",              # 120 (JAX)
    "tests/train/run/test_train_reproducible.py",                # 105
    "tests/distribute/test_distribute_noise_scale.py",           # 90
    "tests/distribute/test_distribute_adaptive_batch.py",        # 75
    "tests/package/test_registration.py",                        # 65
    "tests/train/checkpointing/test_checkpoint_faults.py",       # 65
    "tests/train/run/test_train_jobs.py",                        # 60
    "tests/train/run/test_train_run_folder.py",                  # 40
    "tests/distribute/test_cost_model.py",                       # 35
    "tests/distribute/test_distribute_all_reduce.py",            # 35
    "tests/optimizers/test_replicas_tf.py",                      # 30
    "tests/package/test_source_checkout.py",                     # 30
)


def pytest_collection_modifyitems(config, items):
    """Puts the files of COSTLIEST_FIRST first, in its order (a stable sort:
    every file's tests keep their order)."""
    rank = {path: i for i, path in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(
        item.nodeid.split("::")[0], len(COSTLIEST_FIRST)))
