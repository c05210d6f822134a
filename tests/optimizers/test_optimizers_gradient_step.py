"""What LARSMixed hands its inner rule: one `GradientStep` argument per step,
and no attribute written on the rule (or on itself) during a step."""

import dataclasses

import keras
import numpy as np
import pytest

import keras_largebatch as klb
from keras_largebatch.optimizers import layerwise

SCALE = 2.0**10


def _model_and_grads(seed=3):
    model = keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3),
    ])
    rng = np.random.default_rng(seed)
    grads = [rng.normal(0, 1e-3, v.shape).astype("float32")
             for v in model.trainable_variables]
    return model.trainable_variables, grads


def _record_steps(optimizer):
    """Records every `gradient_step` the inner rule's `apply` receives."""
    seen = []
    inner = optimizer.inner_optimizer
    original = inner.apply

    def apply(grads, trainable_variables=None, gradient_step=None):
        seen.append(gradient_step)
        return original(grads, trainable_variables, gradient_step)

    inner.apply = apply
    return seen


def test_rule_gets_the_inverse_scale_and_the_norms_of_the_scaled_gradients():
    variables, grads = _model_and_grads()
    optimizer = klb.LARSMixed(0.1, weight_decay=1e-4, initial_scale=SCALE)
    seen = _record_steps(optimizer)
    optimizer.apply([keras.ops.convert_to_tensor(g * np.float32(SCALE))
                     for g in grads], variables)
    (step,) = seen
    assert isinstance(step, layerwise.GradientStep)
    assert not step.unscaled
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(step.inverse_scale), 1 / SCALE)
    assert step.reduced == (keras.backend.backend() == "tensorflow")
    inner = optimizer.inner_optimizer
    for v, g in zip(variables, grads):
        expected = np.sum((g.astype("float64") * SCALE) ** 2)
        key = optimizer._var_key(v)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(step.squared_norms[key]), expected,
            rtol=1e-5)
    # Outside the step the rule holds no wrapper's values.
    assert inner.gradient_step == layerwise.GradientStep()
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.inverse_scale = 1.0


def test_clipping_rule_gets_unscaled_gradients_and_no_norms():
    variables, grads = _model_and_grads()
    optimizer = klb.LARSMixed(0.1, initial_scale=SCALE, clipnorm=1.0)
    seen = _record_steps(optimizer)
    optimizer.apply([keras.ops.convert_to_tensor(g * np.float32(SCALE))
                     for g in grads], variables)
    (step,) = seen
    assert step.unscaled and not step.squared_norms


def test_a_step_writes_no_attribute_on_the_rule_or_the_wrapper(
        monkeypatch, apply_step):
    variables, grads = _model_and_grads()
    optimizer = klb.LARSMixed(0.1, weight_decay=1e-4, initial_scale=SCALE)
    scaled = [g * np.float32(SCALE) for g in grads]
    apply_step(optimizer, scaled, variables)  # Builds.
    inner = optimizer.inner_optimizer
    written = []
    for cls in (type(inner), type(optimizer)):
        original = cls.__setattr__

        def record(self, name, value, original=original):
            if self is inner or self is optimizer:
                written.append((type(self).__name__, name))
            return original(self, name, value)

        monkeypatch.setattr(cls, "__setattr__", record)
    before = np.array([keras.ops.convert_to_numpy(v) for v in variables[:1]])
    apply_step(optimizer, scaled, variables)
    apply_step(optimizer, [g * np.float32(np.inf) for g in scaled], variables)
    assert written == []
    after = np.array([keras.ops.convert_to_numpy(v) for v in variables[:1]])
    assert not np.array_equal(before, after)  # The finite step did update.


def test_rule_of_each_variable_has_named_fields():
    variables, _ = _model_and_grads()
    optimizer = klb.LARS(0.1, weight_decay=1e-4)
    optimizer.build(variables)
    kernel, bias = variables[:2]
    assert optimizer.rule_for(kernel) == layerwise.VariableRule(
        updated=True, decayed=True, adapted=True)
    assert optimizer.rule_for(bias) == layerwise.VariableRule(
        updated=True, decayed=False, adapted=False)


def test_fused_update_is_registered_by_backend_and_kept_by_subclasses():
    class MyLARS(klb.LARS):
        pass

    found = [layerwise.fused_update_step(opt(0.1))
             for opt in (klb.LARS, MyLARS, klb.LAMB)]
    if keras.backend.backend() == "torch":
        from keras_largebatch.optimizers import torch_lamb
        from keras_largebatch.optimizers import torch_lars

        assert found == [torch_lars.update_step, torch_lars.update_step,
                         torch_lamb.update_step]
    else:
        assert found == [None, None, None]
