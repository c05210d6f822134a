"""LARSMixed checkpoints hold every variable once and load back."""

import h5py
import keras
import numpy as np
import pytest

import keras_largebatch
from keras_largebatch.optimizers import checkpoint


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
    """The values stored under `group`, but for the layout records."""
    total = []
    with h5py.File(path, "r") as f:
        f[group].visititems(
            lambda name, obj: total.append(obj.size)
            if isinstance(obj, h5py.Dataset) and not name.endswith("layout")
            else None)
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


def test_state_is_under_its_own_path_and_the_stock_paths_are_empty(
        tmp_path):
    model = _trained()
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    with h5py.File(path, "r") as f:
        assert len(f["optimizer/vars"]) == 0
        assert len(f.get("optimizer/inner_optimizer/vars", {})) == 0
        state = f[f"optimizer/{checkpoint.ATTRIBUTE}/vars"]
        assert len(state) == len(model.optimizer.variables) + 1


@pytest.mark.parametrize("old", ["own_variables", "all_variables"])
def test_checkpoint_in_an_earlier_layout_is_skipped_with_a_warning(
        tmp_path, monkeypatch, old):
    # Earlier releases wrote the wrapper's own variables (or, before that,
    # all of them) by position under `optimizer/vars`, as a stock
    # `LossScaleOptimizer` does: nothing tells them apart from one.
    model = _trained()
    lso = keras.optimizers.LossScaleOptimizer
    if old == "own_variables":
        monkeypatch.setattr(
            keras_largebatch.LARSMixed, "save_own_variables",
            lambda self, store: [
                store.__setitem__(str(i), v.numpy())
                for i, v in enumerate(self._variables)])
        monkeypatch.setattr(model.optimizer.inner_optimizer,
                            "saved_by_wrapper", False)
    else:
        monkeypatch.setattr(keras_largebatch.LARSMixed,
                            "save_own_variables", lso.save_own_variables)
    monkeypatch.setattr(checkpoint.OptimizerState, "save_own_variables",
                        lambda self, store: None)
    path = str(tmp_path / "old.weights.h5")
    model.save_weights(path)
    monkeypatch.undo()
    other = _trained(seed=1)
    before = [v.numpy() for v in other.optimizer.variables]
    with pytest.warns(UserWarning, match="Skipping variable loading"):
        other.load_weights(path)
    for a, b in zip(before, [v.numpy() for v in other.optimizer.variables]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)
