"""Configs cover every constructor argument; save/load restores state."""

import inspect

import keras
import numpy as np
import pytest

import keras_largebatch as klb


def constructor_arguments(cls):
    return {
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


@pytest.mark.parametrize(
    "instance",
    [
        klb.LARS(0.1),
        klb.LARSMixed(0.1),
        klb.LAMB(1e-3),
        klb.LAMBMixed(1e-3),
        klb.WarmupPolynomialDecay(1.0, 10, 100),
    ],
    ids=lambda x: type(x).__name__,
)
def test_config_covers_every_constructor_argument(instance):
    missing = constructor_arguments(type(instance)) - set(instance.get_config())
    assert not missing


@pytest.mark.parametrize(
    "make",
    [
        lambda: klb.LARS(
            klb.WarmupPolynomialDecay(2.0, 5, 50, end_learning_rate=1e-3),
            momentum=0.8, eta=0.002, weight_decay=5e-4, epsilon=1e-9,
            nesterov=True, exclude_from_weight_decay=["head/"],
            exclude_from_layer_adaptation=["^stem"], clipnorm=2.0,
        ),
        lambda: klb.LARSMixed(
            0.3, momentum=0.7, eta=0.004, weight_decay=1e-4,
            exclude_from_weight_decay=["a"], exclude_from_layer_adaptation=["b"],
            initial_scale=128.0, dynamic_growth_steps=7, global_clipnorm=1.0,
        ),
        lambda: klb.LAMB(
            klb.WarmupPolynomialDecay(2e-3, 5, 50), beta_1=0.8, beta_2=0.99,
            epsilon=1e-8, weight_decay=1e-2, exclude_from_weight_decay=["head/"],
            exclude_from_layer_adaptation=["^stem"], trust_clip=True,
            global_clipnorm=1.0,
        ),
        lambda: klb.LAMBMixed(
            2e-3, beta_1=0.85, beta_2=0.98, epsilon=1e-7, weight_decay=1e-3,
            exclude_from_weight_decay=["a"], exclude_from_layer_adaptation=["b"],
            trust_clip=True, initial_scale=256.0, dynamic_growth_steps=9,
            clipnorm=1.0,
        ),
    ],
    ids=["LARS", "LARSMixed", "LAMB", "LAMBMixed"],
)
def test_serialize_round_trip_keeps_type_and_config(make):
    optimizer = make()
    config = keras.optimizers.serialize(optimizer)
    assert config["module"] == "keras_largebatch" or "keras_largebatch" in (
        config.get("registered_name") or ""
    )
    restored = keras.optimizers.deserialize(config)
    assert type(restored) is type(optimizer)
    assert restored.get_config() == optimizer.get_config()


def test_schedule_round_trip_gives_same_values():
    schedule = klb.WarmupPolynomialDecay(3.0, 4, 10, end_learning_rate=0.01, power=3.0,
                                         initial_learning_rate=0.5)
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule)
    )
    steps = np.arange(20)
    np.testing.assert_allclose(
        [float(restored(s)) for s in steps], [float(schedule(s)) for s in steps]
    )


def small_model():
    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, name="d1"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.ReLU(),
        keras.layers.Dense(3, name="head"),
    ])


@pytest.mark.parametrize("policy", ["mixed_float16", "float16"])
def test_save_and_load_restores_state_and_training_continues_identically(tmp_path, policy):
    keras.config.set_dtype_policy(policy)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.normal(size=(64, 3)).astype("float32")
    model = small_model()
    model.compile(
        optimizer=klb.LARSMixed(
            klb.WarmupPolynomialDecay(0.5, 2, 20), momentum=0.9, eta=0.01,
            weight_decay=1e-3, initial_scale=64.0, dynamic_growth_steps=3,
            exclude_from_weight_decay=["head/"],
        ),
        loss="mse",
    )
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)

    assert type(loaded.optimizer) is klb.LARSMixed
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    names = [v.name for v in model.optimizer.variables]
    # Slot names follow variable paths, as Keras' do; a loaded Sequential's
    # paths may lose the model's prefix, so compare the structure.
    assert len(loaded.optimizer.variables) == len(names)
    assert [n.rsplit("_", 1)[-1] for n in names] == [
        v.name.rsplit("_", 1)[-1] for v in loaded.optimizer.variables
    ]
    if policy == "float16":
        assert sum(n.endswith("_master") for n in names) == len(model.trainable_variables)
    # 8 finite steps, growth every 3: the restored scale is not the initial one.
    assert float(keras.ops.convert_to_numpy(loaded.optimizer.dynamic_scale)) == 64.0 * 2**2
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.name
        )

    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a).astype("float64"),
            keras.ops.convert_to_numpy(b).astype("float64"),
            rtol=1e-6, atol=1e-7, err_msg=a.path,
        )
