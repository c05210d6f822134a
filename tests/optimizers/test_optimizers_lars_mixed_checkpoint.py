"""LARSMixed checkpoints hold every variable once and load back."""

import h5py
import keras
import numpy as np

import keras_largebatch


def _trained(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)),
                              keras.layers.Dense(5, name="hidden"),
                              keras.layers.Dense(3, name="out")])
    model.compile(optimizer=keras_largebatch.LARSMixed(0.1, momentum=0.9),
                  loss="mse")
    rng = np.random.default_rng(seed)
    model.fit(rng.normal(size=(16, 6)) * 1e-2, rng.normal(size=(16, 3)),
              batch_size=8, epochs=1, verbose=0)
    return model


def _stored_floats(path, group):
    total = []
    with h5py.File(path, "r") as f:
        f[group].visititems(lambda name, obj: total.append(obj.size)
                            if isinstance(obj, h5py.Dataset) else None)
    return sum(total)


def test_checkpoint_stores_the_momentum_once(tmp_path):
    model = _trained()
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    opt = model.optimizer
    expected = sum(int(np.prod(v.shape)) for v in opt.variables)
    params = sum(int(np.prod(w.shape)) for w in model.weights)
    # Without the fix: the inner optimizer's variables twice.
    assert _stored_floats(path, "optimizer") == expected
    assert _stored_floats(path, "layers") == params


def _momenta(model):
    return [v.numpy() for v in model.optimizer.inner_optimizer.variables
            if "momentum" in v.path]


def test_checkpoint_restores_momentum_and_loss_scale(tmp_path):
    model = _trained()
    model.optimizer.dynamic_scale.assign(1024.0)
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    other = _trained(seed=1)
    other.load_weights(path)
    assert float(other.optimizer.dynamic_scale.numpy()) == 1024.0
    for a, b in zip(_momenta(model), _momenta(other)):
        np.testing.assert_array_equal(a, b)
    assert any(np.abs(m).max() > 0 for m in _momenta(other))


def test_checkpoint_written_before_the_fix_still_loads(tmp_path,
                                                       monkeypatch):
    model = _trained()
    monkeypatch.setattr(
        keras_largebatch.LARSMixed, "save_own_variables",
        keras.optimizers.LossScaleOptimizer.save_own_variables)
    path = str(tmp_path / "old.weights.h5")
    model.save_weights(path)
    monkeypatch.undo()
    other = _trained(seed=1)
    other.load_weights(path)
    for a, b in zip(_momenta(model), _momenta(other)):
        np.testing.assert_array_equal(a, b)
