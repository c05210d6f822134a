"""The private Keras API keras_largebatch relies on, against the installed Keras.

Keras has no public hook for these; each row says where and why it is used.
The rows were checked on the Keras versions that `pyproject.toml` accepts
(`KERAS_CHECKED`); a Keras that moves one fails here, naming it, before it
fails inside a training step.
"""

import inspect

import keras
import numpy as np
import pytest

from keras_largebatch.optimizers import mixed

KERAS_CHECKED = "3.12.4 and 3.15.1"

OPTIMIZER = keras.optimizers.Optimizer
BACKUP = keras.callbacks.BackupAndRestore

# (owner, name, parameters after `self`, where and why)
METHODS = [
    (OPTIMIZER, "_var_key", ["variable"],
     "optimizers: the key of a variable's rule and of its squared norm in a "
     "GradientStep; on TensorFlow it resolves the raw tf.Variable that "
     "update_step receives"),
    (OPTIMIZER, "_get_variable_index", ["variable"],
     "LARS/LAMB update_step and GradientNoiseScale: a variable's slots, as "
     "Keras' own optimizers find them"),
    (OPTIMIZER, "_backend_update_step",
     ["grads", "trainable_variables", "learning_rate"],
     "overridden by LayerwiseOptimizer: the backend's fused update of the "
     "whole step (torch)"),
    (OPTIMIZER, "_apply_weight_decay", ["variables"],
     "overridden by LayerwiseOptimizer: weight decay is coupled into the "
     "update instead"),
    (OPTIMIZER, "_use_weight_decay", ["variable"],
     "LayerwiseOptimizer.is_decayed honours Keras' "
     "exclude_from_weight_decay(var_list=..., var_names=...)"),
    (keras.Model, "_flatten_layers", ["include_self", "recursive"],
     "precise batch norm and the command's seed states: every nested layer"),
    (BACKUP, "_load_model", [],
     "the command's Backup restores the seed states after Keras' restore"),
    (BACKUP, "_save_model", [],
     "the command's Backup writes atomically and per process"),
]
TENSORFLOW_METHODS = [
    (OPTIMIZER, "_all_reduce_sum_gradients", ["grads_and_vars"],
     "overridden by LayerwiseOptimizer: under tf.distribute a mixed wrapper "
     "has summed the loss-scaled gradients already"),
]
# Set by `build`: (name, type, where and why).
OPTIMIZER_STATE = [
    ("_trainable_variables", list,
     "MixedOptimizer.apply without variables, its stateless mapping, and "
     "GradientNoiseScale"),
    ("_variables", list,
     "MixedOptimizer saves only its own variables (`variables` lists the "
     "inner optimizer's too); GradientNoiseScale removes its own"),
    ("_iterations", keras.Variable,
     "GradientNoiseScale: the micro-batch counter under accumulation"),
    ("_accumulated_gradients", list,
     "GradientNoiseScale: Keras' gradient accumulators"),
]
BACKUP_STATE = ["_weights_path", "_training_metadata_path", "_current_epoch",
                "_last_batch_seen"]


def _changed(owner, name, why):
    return (f"keras_largebatch uses Keras' private `{owner.__name__}.{name}` "
            f"({why}); Keras {keras.__version__} changed it. It was checked "
            f"on Keras {KERAS_CHECKED}: see {__name__}.")


def _methods():
    rows = list(METHODS)
    if keras.backend.backend() == "tensorflow":
        rows += TENSORFLOW_METHODS
    return rows


@pytest.mark.parametrize("owner, name, parameters, why", _methods(),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_private_method_keeps_its_signature(owner, name, parameters, why):
    method = getattr(owner, name, None)
    assert callable(method), _changed(owner, name, why)
    found = list(inspect.signature(method).parameters)[1:]
    assert found == parameters, _changed(owner, name, why) + (
        f" Parameters: {found}, expected {parameters}.")


def test_private_optimizer_state_is_set_by_build():
    variables = [keras.Variable(np.ones((2, 2), "float32"))]
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    optimizer.build(variables)
    for name, kind, why in OPTIMIZER_STATE:
        value = getattr(optimizer, name, None)
        assert isinstance(value, kind), _changed(OPTIMIZER, name, why)
    assert optimizer._trainable_variables == variables
    assert optimizer._get_variable_index(variables[0]) == 0


def test_private_backup_state_exists_after_construction(tmp_path):
    backup = BACKUP(str(tmp_path))
    for name in BACKUP_STATE:
        assert hasattr(backup, name), _changed(
            BACKUP, name, "the command's Backup writes the same files")


def test_mixed_optimizer_overrides_only_public_loss_scale_methods():
    # Keras documents LossScaleOptimizer's public methods only; the mixed
    # optimizers override none of its private ones.
    own = vars(mixed.MixedOptimizer)
    inherited = {name for name in vars(keras.optimizers.LossScaleOptimizer)
                 if name.startswith("_") and not name.startswith("__")}
    assert sorted(inherited & set(own)) == []
