"""The private Keras API keras_largebatch relies on, against the installed Keras.

Keras has no public hook for these; each row says where and why it is used.
The rows were checked on the Keras versions that `pyproject.toml` accepts
(`KERAS_CHECKED`); a Keras that moves one fails here, naming it, before it
fails inside a training step. Where the package repeats a Keras method's
steps, the method's body is pinned too (`BODIES`, a source hash per checked
version), so that a step a new release adds fails here instead of being
skipped; a version with no recorded bodies is skipped with what to re-check
(CI installs the newest Keras `pyproject.toml` accepts, not a fixed one).
Keras' development head and what moved there: docs/keras-versions.md.
"""

import hashlib
import importlib
import inspect
import json

import keras
import numpy as np
import pytest

from keras_largebatch import adaptive_batch
from keras_largebatch import noise_scale
from keras_largebatch import precise_bn
from keras_largebatch.optimizers import checkpoint
from keras_largebatch.optimizers import keras_apply
from keras_largebatch.optimizers import lamb
from keras_largebatch.optimizers import lars
from keras_largebatch.optimizers import layerwise
from keras_largebatch.optimizers import mixed
from keras_largebatch.train.checkpointing import backup

KERAS_CHECKED = "3.12.4, 3.15.1 and the nightly 3.16.0.dev2026102704"

OPTIMIZER = keras.optimizers.Optimizer
BACKUP = keras.callbacks.BackupAndRestore
SAVEABLE = ("keras.src.saving.keras_saveable", "KerasSaveable")

# `LayerwiseOptimizer.apply`, given a `GradientStep`, runs Keras' `apply` and
# `_backend_apply_gradients` again from their own steps: the rows whose
# reason starts with this.
APPLY = ("LayerwiseOptimizer.apply runs Keras' apply again with a "
         "GradientStep: ")

# (owner, name, parameters after `self`, where and why)
METHODS = [
    (OPTIMIZER, "_check_variables_are_known", ["variables"],
     APPLY + "the variables were built"),
    (OPTIMIZER, "_filter_empty_gradients", ["grads", "vars"],
     APPLY + "drops the variables without a gradient"),
    (OPTIMIZER, "_overwrite_variables_directly_with_gradients",
     ["grads", "vars"],
     APPLY + "assigns the `overwrite_with_gradient` variables (float8)"),
    (OPTIMIZER, "_clip_gradients", ["grads"],
     APPLY + "clipnorm, global_clipnorm, clipvalue"),
    (OPTIMIZER, "_backend_increment_gradient_accumulators",
     ["grads", "acc_grads"],
     APPLY + "adds a micro-batch to Keras' accumulators"),
    (OPTIMIZER, "_backend_reset_gradient_accumulators", [],
     APPLY + "zeroes Keras' accumulators after an update"),
    (OPTIMIZER, "_update_model_variables_moving_average",
     ["trainable_variables"],
     APPLY + "the EMA of the weights (use_ema)"),
    (OPTIMIZER, "_backend_update_step",
     ["grads", "trainable_variables", "learning_rate"],
     "overridden by LayerwiseOptimizer (with a `gradient_step` after "
     "Keras' parameters): the fused update of the whole step, or on "
     "TensorFlow Keras' own per-variable update under the strategy"),
    (OPTIMIZER, "_apply_weight_decay", ["variables"],
     "overridden by LayerwiseOptimizer: weight decay is coupled into the "
     "update instead"),
    (OPTIMIZER, "_var_key", ["variable"],
     "LayerwiseOptimizer and MixedOptimizer: the key of a variable's rule, "
     "its float32 master, its squared norm in a GradientStep and its entry "
     "in exclude_from_weight_decay(var_list=...); on TensorFlow it resolves "
     "the raw tf.Variable that update_step receives"),
    (OPTIMIZER, "_get_variable_index", ["variable"],
     "LARS/LAMB update_step and their torch paths: a variable's slots; "
     "LayerwiseOptimizer.apply and NoiseScaleOptimizer: a variable's "
     "accumulator"),
    (keras.Model, "_flatten_layers", ["include_self", "recursive"],
     "precise batch norm and the command's seed states: every nested layer"),
    (BACKUP, "_load_model", [],
     "the command's Backup restores the seed states after Keras' restore"),
    (BACKUP, "_save_model", [],
     "the command's Backup writes atomically and per process"),
]
TENSORFLOW_METHODS = [
    (OPTIMIZER, "_all_reduce_sum_gradients", ["grads_and_vars"],
     "LayerwiseOptimizer's TensorFlow update calls it as Keras' does, "
     "unless a mixed wrapper has summed the loss-scaled gradients already"),
]
# Set by `build` of an optimizer with accumulation and EMA: (name, type,
# where and why).
OPTIMIZER_STATE = [
    ("_trainable_variables", list,
     "LayerwiseOptimizer, MixedOptimizer and NoiseScaleOptimizer: `apply` "
     "without variables, the EMA, their stateless mapping"),
    ("_variables", list,
     "NoiseScaleOptimizer: its own variables (its `variables` adds the "
     "wrapped optimizer's), saved and mapped by position"),
    ("_iterations", keras.Variable,
     "LayerwiseOptimizer.apply counts the step; NoiseScaleOptimizer and "
     "AdaptiveBatch: the micro-batch counter under accumulation"),
    ("_accumulated_gradients", list,
     "LayerwiseOptimizer.apply and NoiseScaleOptimizer: Keras' gradient "
     "accumulators"),
    ("_model_variables_moving_average", list,
     APPLY + "the EMA a `ema_overwrite_frequency` step assigns"),
    ("_learning_rate", keras.Variable,
     "AdaptiveBatch: the compiled rate it scales (a Variable, or the "
     "schedule itself)"),
]
# Set by the TensorFlow optimizer's constructor: (name, where and why).
TENSORFLOW_OPTIMIZER_STATE = [
    ("_distribution_strategy",
     "LayerwiseOptimizer's TensorFlow update runs in the strategy the "
     "optimizer was made in, as Keras' does"),
]
# Bodies, not only signatures: `keras_apply.apply` and `apply_gradients`
# (optimizers/keras_apply.py) repeat the steps of Keras' `apply` and
# `_backend_apply_gradients`, and on TensorFlow `tensorflow_update_step`
# repeats `_backend_update_step`; a step Keras adds to one of them would be
# skipped silently. The seven private methods `apply` reaches, which the
# package calls in turn, are pinned with them.
# Keras' method -> the package's copy of its steps.
COPIES = {"apply": keras_apply.apply,
          "_backend_apply_gradients": keras_apply.apply_gradients}
TENSORFLOW_COPIES = {"_backend_update_step": keras_apply.tensorflow_update_step}
REIMPLEMENTED = list(COPIES)
TENSORFLOW_REIMPLEMENTED = list(TENSORFLOW_COPIES)
CALLED = ["_check_variables_are_known", "_filter_empty_gradients",
          "_overwrite_variables_directly_with_gradients", "_clip_gradients",
          "_backend_increment_gradient_accumulators",
          "_backend_reset_gradient_accumulators",
          "_update_model_variables_moving_average"]
# Keras version -> {defining class.method: sha256 of its source, 16 hex}, as
# `python tests/test_keras_private_api.py` prints them, once per backend.
# 3.12.4 and 3.15.1 have the same bodies.
_BODIES_3_12_TO_3_15 = {
    "BaseOptimizer.apply": "43097be63b919d03",
    "BaseOptimizer._backend_apply_gradients": "48d6e24d58039241",
    "JaxOptimizer._backend_apply_gradients": "6952aaee4628e60a",
    "TFOptimizer._backend_update_step": "00bd759c099a6b72",
    "BaseOptimizer._check_variables_are_known": "7fe637cd983aad42",
    "BaseOptimizer._filter_empty_gradients": "a780e49af0d5bd93",
    "BaseOptimizer._overwrite_variables_directly_with_gradients":
        "25889236cdb59405",
    "BaseOptimizer._clip_gradients": "152b956e23c91ad9",
    "BaseOptimizer._backend_increment_gradient_accumulators":
        "cda762a003fb02be",
    "TFOptimizer._backend_increment_gradient_accumulators":
        "5e5ed334c33b5a56",
    "BaseOptimizer._backend_reset_gradient_accumulators": "4e9ad3b3e598cfb6",
    "BaseOptimizer._update_model_variables_moving_average":
        "ae5df2205d65bb21",
}
# keras-nightly 3.16.0.dev2026102704: `_backend_apply_gradients` hands the
# EMA overwrite to a new `_backend_maybe_overwrite_model_variables` (on
# TensorFlow under `merge_call`), the step `keras_apply.apply_gradients`
# takes as a `where`; the four others call `backend.ops.numpy` for `ops`, no
# step changed.
_BODIES_3_16_DEV = {
    **_BODIES_3_12_TO_3_15,
    "BaseOptimizer._backend_apply_gradients": "4de6fa4f3a26833f",
    "BaseOptimizer._overwrite_variables_directly_with_gradients":
        "fc2fe2ef711604ee",
    "BaseOptimizer._clip_gradients": "09c1f7e0bfe4e0ee",
    "BaseOptimizer._backend_reset_gradient_accumulators": "e41254cd564cc032",
    "BaseOptimizer._update_model_variables_moving_average":
        "28f9ba7a0c8c1ee4",
}
BODIES = {"3.12.4": _BODIES_3_12_TO_3_15, "3.15.1": _BODIES_3_12_TO_3_15,
          "3.16.0.dev2026102704": _BODIES_3_16_DEV}
BACKUP_STATE = ["_weights_path", "_training_metadata_path", "_current_epoch",
                "_last_batch_seen"]
SEED_GENERATORS = ("the command's Backup saves the state of every layer's "
                   "SeedGenerator (dropout masks on resume)")
SAVING = ("LARSMixed/LAMBMixed save their state through a KerasSaveable "
          "attribute, which Keras' saving gives a store at its own path "
          "(optimizers/checkpoint.py)")

# Package classes and the Keras base whose private methods they override:
# any other private name they define must not be one of Keras'.
OVERRIDES = [
    (layerwise.LayerwiseOptimizer, OPTIMIZER,
     ["_apply_weight_decay", "_backend_update_step"]),
    (lars.LARS, OPTIMIZER, []),
    (lamb.LAMB, OPTIMIZER, []),
    (mixed.MixedOptimizer, keras.optimizers.LossScaleOptimizer, []),
    (noise_scale.NoiseScaleOptimizer, OPTIMIZER, []),
    (checkpoint.OptimizerState, checkpoint.KerasSaveable, ["_obj_type"]),
    (noise_scale.GradientNoiseScale, keras.callbacks.Callback, []),
    (adaptive_batch.AdaptiveBatch, keras.callbacks.Callback, []),
    (precise_bn.PreciseBatchNorm, keras.callbacks.Callback, []),
    (backup.Backup, BACKUP, ["_load_model", "_save_model"]),
]


def _changed(owner, name, why):
    owner = owner if isinstance(owner, str) else owner.__name__
    return (f"keras_largebatch uses Keras' private `{owner}.{name}` "
            f"({why}); Keras {keras.__version__} changed it. It was checked "
            f"on Keras {KERAS_CHECKED}: see {__name__}.")


def _on_tensorflow(rows, tensorflow_rows):
    if keras.backend.backend() == "tensorflow":
        return rows + tensorflow_rows
    return rows


def test_private_methods_keep_their_signatures():
    changed = []
    for owner, name, parameters, why in _on_tensorflow(
            METHODS, TENSORFLOW_METHODS):
        method = getattr(owner, name, None)
        if not callable(method):
            changed.append(_changed(owner, name, why))
            continue
        found = list(inspect.signature(method).parameters)[1:]
        if found != parameters:
            changed.append(_changed(owner, name, why) + (
                f" Parameters: {found}, expected {parameters}."))
    assert not changed, "\n".join(changed)


def _built_optimizer(variables, learning_rate=0.1):
    optimizer = keras.optimizers.SGD(
        learning_rate, gradient_accumulation_steps=2, use_ema=True,
        clipvalue=0.5)
    optimizer.build(variables)
    return optimizer


def test_private_optimizer_state_is_set_by_build():
    variables = [keras.Variable(np.ones((2, 2), "float32"))]
    optimizer = _built_optimizer(variables)
    for name, kind, why in OPTIMIZER_STATE:
        value = getattr(optimizer, name, None)
        assert isinstance(value, kind), _changed(OPTIMIZER, name, why)
    assert optimizer._trainable_variables == variables
    assert optimizer._get_variable_index(variables[0]) == 0
    assert len(optimizer._accumulated_gradients) == 1
    assert len(optimizer._model_variables_moving_average) == 1
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert _built_optimizer(variables, schedule)._learning_rate is schedule, (
        _changed(OPTIMIZER, "_learning_rate", OPTIMIZER_STATE[-1][2]))
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        for name, why in TENSORFLOW_OPTIMIZER_STATE:
            value = getattr(optimizer, name, None)
            assert isinstance(value, tf.distribute.Strategy), _changed(
                OPTIMIZER, name, why)


def test_private_apply_steps_do_what_layerwise_apply_expects():
    a = keras.Variable(np.ones(2, "float32"), name="a")
    b = keras.Variable(np.ones(2, "float32"), name="b")
    optimizer = _built_optimizer([a, b])

    def check(condition, name):
        why = next(row[3] for row in METHODS if row[1] == name)
        assert condition, _changed(OPTIMIZER, name, why)

    with pytest.raises(ValueError):
        optimizer._check_variables_are_known([keras.Variable([1.0])])
    with pytest.warns(UserWarning):
        grads, variables = optimizer._filter_empty_gradients(
            [None, keras.ops.full((2,), 2.0)], [a, b])
    check(variables == [b] and len(grads) == 1, "_filter_empty_gradients")
    grads, variables = optimizer._overwrite_variables_directly_with_gradients(
        grads, variables)
    check(variables == [b] and len(grads) == 1,
          "_overwrite_variables_directly_with_gradients")
    grads = optimizer._clip_gradients(grads)
    check(np.allclose(keras.ops.convert_to_numpy(grads[0]), 0.5),
          "_clip_gradients")
    accumulator = optimizer._accumulated_gradients[
        optimizer._get_variable_index(b)]
    optimizer._backend_increment_gradient_accumulators(grads, [accumulator])
    check(np.allclose(keras.ops.convert_to_numpy(accumulator), 0.5),
          "_backend_increment_gradient_accumulators")
    optimizer._backend_reset_gradient_accumulators()
    check(np.allclose(keras.ops.convert_to_numpy(accumulator), 0.0),
          "_backend_reset_gradient_accumulators")


def test_private_backup_state_exists_after_construction(tmp_path):
    backup = BACKUP(str(tmp_path))
    for name in BACKUP_STATE:
        assert hasattr(backup, name), _changed(
            BACKUP, name, "the command's Backup writes the same files")


def test_private_seed_generators_of_a_layer():
    layer = keras.layers.Dropout(0.5)
    assert getattr(layer, "_seed_generators", None) == [
        layer.seed_generator], _changed(
            keras.layers.Layer, "_seed_generators", SEED_GENERATORS)


def test_saving_gives_a_saveable_attribute_its_own_store(tmp_path):
    h5py = pytest.importorskip("h5py")
    module, name = SAVEABLE
    saveable = getattr(importlib.import_module(module), name, None)
    assert isinstance(saveable, type) and issubclass(OPTIMIZER, saveable), (
        _changed(module, name, SAVING))
    loaded = []

    class Probe(saveable):
        def _obj_type(self):
            return "Optimizer"

        def save_own_variables(self, store):
            store["0"] = np.arange(3.0)

        def load_own_variables(self, store):
            loaded.append(np.asarray(store["0"]))

    def model():
        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        m.optimizer.build(m.trainable_variables)
        m.optimizer.probe = Probe()
        return m

    path = str(tmp_path / "probe.weights.h5")
    model().save_weights(path)
    with h5py.File(path, "r") as f:
        saved = "optimizer/probe/vars/0" in f
    model().load_weights(path)
    assert saved and len(loaded) == 1, _changed(
        "keras.src.saving.saving_lib", "_walk_saveable", SAVING + "; an "
        "attribute `probe` was not saved and loaded at optimizer/probe/vars")
    np.testing.assert_array_equal(loaded[0], np.arange(3.0))


def test_private_overrides_are_only_the_listed_ones():
    added = []
    for cls, base, overrides in OVERRIDES:
        keras_private = {name for name in dir(base)
                         if name.startswith("_") and not name.startswith("__")}
        extra = sorted(set(vars(cls)) & keras_private - set(overrides))
        if extra:
            added.append(f"{cls.__name__} overrides Keras' private {extra}: "
                         f"Keras {keras.__version__} added them to "
                         f"{base.__name__}.")
    assert not added, "\n".join(added)


def _bodies():
    """{qualified name: source hash} of the pinned methods as this backend's
    `keras.optimizers.Optimizer` resolves them."""
    names = REIMPLEMENTED + CALLED
    if keras.backend.backend() == "tensorflow":
        names = names + TENSORFLOW_REIMPLEMENTED
    found = {}
    for name in names:
        method = getattr(OPTIMIZER, name)
        source = inspect.getsource(method).encode()
        found[method.__qualname__] = hashlib.sha256(source).hexdigest()[:16]
    return found


def _where(function):
    """`module.function` (path) of the package's copy of a Keras body."""
    module = inspect.getmodule(function)
    path = module.__name__.replace(".", "/") + ".py"
    return f"`{module.__name__.rsplit('.', 1)[1]}.{function.__name__}` ({path})"


def test_reimplemented_keras_bodies_are_the_checked_ones():
    version = keras.__version__
    if version not in BODIES:
        pytest.skip(
            f"Keras {version}: no method bodies recorded (checked: "
            f"{', '.join(BODIES)}). Compare Keras' Optimizer.apply and "
            "_backend_apply_gradients (and TensorFlow's "
            "_backend_update_step) with keras_apply.apply, "
            "apply_gradients and tensorflow_update_step "
            "(optimizers/keras_apply.py); then run "
            f"`KERAS_BACKEND=... python {__file__}` on each backend and add "
            "what it prints to BODIES.")
    recorded = BODIES[version]
    changed = []
    for name, digest in _bodies().items():
        if recorded.get(name) == digest:
            continue
        method = name.rsplit(".", 1)[1]
        copy = {**COPIES, **TENSORFLOW_COPIES}.get(method)
        what = (f"{_where(copy)} repeats its steps: add any new step there"
                if copy is not None
                else f"{_where(keras_apply.apply)} calls it: check it still "
                "does what the row of METHODS says")
        changed.append(
            f"The body of Keras' `{name}` is not the one recorded for Keras "
            f"{version} (sha256 {digest}, recorded "
            f"{recorded.get(name)}): {what}, then record the new hash in "
            "BODIES.")
    assert not changed, "\n".join(changed)


if __name__ == "__main__":
    print(json.dumps({keras.__version__: _bodies()}, indent=4))


def test_weights_made_in_memory_are_the_bytes_save_weights_reads(tmp_path):
    # The command's checkpoints are made in memory (`checkpointing.files.
    # weights_bytes`: Keras' private `saving_lib.H5IOStore` on a BytesIO and
    # `saving_lib._save_state`), so a full disk fails as a plain write.
    from keras.src.saving import saving_lib

    from keras_largebatch.train.checkpointing import files

    for name, parameters in (("_save_state", [
            "saveable", "weights_store", "assets_store", "inner_path",
            "visited_saveables"]),):
        found = list(inspect.signature(getattr(saving_lib, name)).parameters)
        assert found[:len(parameters)] == parameters, _changed(
            "keras.src.saving.saving_lib", name, "checkpointing.files."
            "weights_bytes builds a checkpoint's weights in memory")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    path = tmp_path / "w.weights.h5"
    path.write_bytes(files.weights_bytes(model))
    again = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    again.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="mse")
    again.optimizer.build(again.trainable_variables)
    again.load_weights(str(path))
    for a, b in zip(model.weights + model.optimizer.variables,
                    again.weights + again.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                      keras.ops.convert_to_numpy(b))
