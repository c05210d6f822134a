"""Keras' own `LossScaleOptimizer` tests (keras/src/optimizers/
loss_scale_optimizer_test.py), adapted to LARSMixed and LAMBMixed, the
drop-in replacements: the same arguments and the same loss-scale behaviour.

LARS without momentum is SGD on a vector (a vector gets no trust ratio), so
Keras' expected values hold unchanged for `LARSMixed(0.5, momentum=0)`.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_largebatch as klb

GRADS = [1.0, 6.0, 7.0, 2.0]
START = [1.0, 2.0, 3.0, 4.0]


def _sgd_like(**kwargs):
    return klb.LARSMixed(0.5, momentum=0.0, **kwargs)


def _modes():
    # `stateless_apply` is JAX's trainer's path; Keras' TensorFlow
    # optimizers do not support it.
    if keras.backend.backend() == "tensorflow":
        return [False]
    return [True, False]


def _step(optimizer, grads, variables, stateless):
    """One step; returns the new values of `variables`."""
    if not stateless:
        optimizer.apply(grads, variables)
        return [v.value for v in variables]
    if not optimizer.built:
        optimizer.build(variables)
    new_vars, new_opt_vars = optimizer.stateless_apply(
        [v.value for v in optimizer.variables], grads,
        [v.value for v in variables],
    )
    for ref, value in zip(optimizer.variables, new_opt_vars):
        ref.assign(value)
    for ref, value in zip(variables, new_vars):
        ref.assign(value)
    return new_vars


def test_config_round_trips():
    optimizer = klb.LARSMixed(0.5, momentum=0.06, nesterov=True,
                              weight_decay=0.004, dynamic=True)
    restored = klb.LARSMixed.from_config(optimizer.get_config())
    assert restored.get_config() == optimizer.get_config()


def test_apply_with_no_vars():
    optimizer = _sgd_like()
    variables = [keras.Variable(START)]
    optimizer.build(variables)
    optimizer.apply([ops.array(GRADS) * optimizer.initial_scale])
    np.testing.assert_allclose(
        ops.convert_to_numpy(variables[0]), [0.5, -1.0, -0.5, 3.0],
        rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stateless", _modes())
def test_finite_step(stateless):
    optimizer = _sgd_like()
    variables = [keras.Variable(START)]
    grads = [ops.array(GRADS) * optimizer.initial_scale]
    (value,) = _step(optimizer, grads, variables, stateless)
    np.testing.assert_allclose(
        ops.convert_to_numpy(value), [0.5, -1.0, -0.5, 3.0],
        rtol=1e-4, atol=1e-4)


def test_inner_loss_scale_factor_is_refused():
    # Keras drops the inner optimizer's factor; here it would scale twice.
    with pytest.raises(ValueError, match="loss_scale_factor=100"):
        _sgd_like(loss_scale_factor=100)


@pytest.mark.parametrize("stateless", _modes())
def test_infinite_step(stateless):
    optimizer = _sgd_like()
    variables = [keras.Variable(START)]
    (value,) = _step(optimizer, [ops.array([np.inf] * 4)], variables,
                     stateless)
    np.testing.assert_allclose(ops.convert_to_numpy(value), START)


@pytest.mark.parametrize("stateless", _modes())
def test_finite_step_with_overwrite(stateless):
    optimizer = _sgd_like()
    variables = [keras.Variable(START)]
    variables[0].overwrite_with_gradient = True
    (value,) = _step(optimizer, [ops.array(GRADS)], variables, stateless)
    np.testing.assert_allclose(ops.convert_to_numpy(value), GRADS)


@pytest.mark.parametrize("stateless", _modes())
def test_downscaling(stateless):
    optimizer = _sgd_like(initial_scale=400.0)
    variables = [keras.Variable(START)]
    optimizer.build(variables)
    for _ in range(4):
        _step(optimizer, [ops.array([np.inf] * 4)], variables, stateless)
    assert float(ops.convert_to_numpy(optimizer.scale_loss(1.0))) == 25.0


@pytest.mark.parametrize("stateless", _modes())
def test_upscaling(stateless):
    optimizer = _sgd_like(initial_scale=2.0, dynamic_growth_steps=2)
    variables = [keras.Variable(START)]
    optimizer.build(variables)
    for _ in range(8):
        _step(optimizer, [ops.array(GRADS)], variables, stateless)
    assert float(ops.convert_to_numpy(optimizer.scale_loss(1.0))) == 32.0


@pytest.mark.parametrize("stateless", _modes())
def test_iterations_update(stateless):
    optimizer = _sgd_like()
    variables = [keras.Variable(START)]
    optimizer.build(variables)
    assert int(ops.convert_to_numpy(optimizer.iterations)) == 0
    for i in range(3):
        _step(optimizer, [ops.array(GRADS)], variables, stateless)
        assert int(ops.convert_to_numpy(optimizer.iterations)) == i + 1


def test_serialization():
    optimizer = _sgd_like(initial_scale=3.0, dynamic_growth_steps=2,
                          name="test_opt")
    config = optimizer.get_config()
    assert config["name"] == "test_opt"
    assert config["initial_scale"] == 3.0
    assert config["dynamic_growth_steps"] == 2
    assert config["dynamic"] is True
    klb.LARSMixed.from_config(config)


@pytest.mark.parametrize("cls", [klb.LARSMixed, klb.LAMBMixed])
def test_init_dynamic_arg(cls):
    assert cls(0.5, dynamic=True).dynamic is True
    fixed = cls(0.5, dynamic=False)
    assert fixed.get_config()["dynamic"] is False
    assert cls.from_config(fixed.get_config()).dynamic is False
    with pytest.raises(ValueError, match="`dynamic` must be a bool. "
                                         "Received: dynamic=1"):
        cls(0.5, dynamic=1)


@pytest.mark.parametrize("cls", [klb.LARSMixed, klb.LAMBMixed])
@pytest.mark.parametrize("stateless", _modes())
def test_a_fixed_scale_neither_grows_nor_halves(cls, stateless):
    optimizer = cls(0.5, dynamic=False, initial_scale=8.0,
                    dynamic_growth_steps=1)
    variables = [keras.Variable(START)]
    optimizer.build(variables)
    for grads in (GRADS, [np.inf] * 4, GRADS, GRADS):
        _step(optimizer, [ops.array(grads) * 8.0], variables, stateless)
        assert float(ops.convert_to_numpy(optimizer.scale_loss(1.0))) == 8.0
    # The non-finite step was still skipped: three updates.
    assert int(ops.convert_to_numpy(optimizer.iterations)) == 3


def test_a_fixed_scale_still_skips_a_non_finite_step():
    optimizer = _sgd_like(dynamic=False, initial_scale=4.0)
    variables = [keras.Variable(START)]
    (value,) = _step(optimizer, [ops.array([np.inf] * 4)], variables, False)
    np.testing.assert_allclose(ops.convert_to_numpy(value), START)
    (value,) = _step(optimizer, [ops.array(GRADS) * 4.0], variables, False)
    np.testing.assert_allclose(ops.convert_to_numpy(value),
                               [0.5, -1.0, -0.5, 3.0], rtol=1e-4, atol=1e-4)


def test_init_unsupported_arg():
    with pytest.raises(ValueError, match="foo"):
        klb.LARSMixed(0.5, foo=True, bar=3)
