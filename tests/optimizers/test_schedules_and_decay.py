"""Warmup + polynomial decay, batch scaling, and no-decay filtering."""

import math

import keras
import numpy as np
import pytest

import keras_largebatch as klb


def test_warmup_then_quadratic_decay_values():
    schedule = klb.WarmupPolynomialDecay(
        8.0, warmup_steps=4, decay_steps=10, end_learning_rate=0.5,
        initial_learning_rate=1.0,
    )
    def expected(step):
        if step < 4:
            return 1.0 + 7.0 * step / 4
        t = min(step - 4, 10) / 10
        return 0.5 + 7.5 * (1 - t) ** 2
    for step in range(20):
        assert math.isclose(float(schedule(step)), expected(step), rel_tol=1e-6)


def test_zero_warmup_starts_at_peak():
    schedule = klb.WarmupPolynomialDecay(2.0, warmup_steps=0, decay_steps=4)
    assert math.isclose(float(schedule(0)), 2.0, rel_tol=1e-6)
    assert math.isclose(float(schedule(4)), 1e-4, rel_tol=1e-4)


@pytest.mark.parametrize("rule, expected", [("linear", 3.2), ("sqrt", 0.1 * math.sqrt(32))])
def test_batch_scaling_rules(rule, expected):
    assert math.isclose(
        klb.scale_learning_rate(0.1, 8192, base_batch_size=256, rule=rule), expected
    )


def conv_bn_model():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="fc")(x))


def test_no_decay_variables_are_biases_and_batch_norm():
    model = conv_bn_model()
    paths = [v.path for v in klb.no_decay_variables(model)]
    assert paths == ["conv/bias", "bn/gamma", "bn/beta", "fc/bias"]
    paths = [v.path for v in klb.no_decay_variables(model, extra_patterns=["^fc/"])]
    assert paths == ["conv/bias", "bn/gamma", "bn/beta", "fc/kernel", "fc/bias"]


def test_exclude_bias_and_norm_stops_stock_sgd_decaying_them():
    model = conv_bn_model()
    optimizer = keras.optimizers.SGD(0.1, weight_decay=0.5)
    klb.exclude_bias_and_norm(optimizer, model)
    variables = model.trainable_variables
    for v in variables:
        v.assign(keras.ops.ones(v.shape))
    zeros = [keras.ops.zeros(v.shape) for v in variables]
    optimizer.apply(zeros, variables)
    for v in variables:
        value = keras.ops.convert_to_numpy(v)
        if v.path.endswith("kernel"):
            np.testing.assert_allclose(value, 1.0 - 0.1 * 0.5, rtol=1e-6, err_msg=v.path)
        else:
            np.testing.assert_array_equal(value, 1.0, err_msg=v.path)


@pytest.mark.parametrize("wrap", [
    keras.optimizers.LossScaleOptimizer,
    lambda o: klb.NoiseScaleOptimizer(keras.optimizers.LossScaleOptimizer(o)),
], ids=["loss_scale", "noise_scale_over_loss_scale"])
def test_exclude_bias_and_norm_reaches_the_rule_under_every_wrapper(wrap):
    model = conv_bn_model()
    rule = keras.optimizers.SGD(0.1, weight_decay=0.5)
    klb.exclude_bias_and_norm(wrap(rule), model)
    variables = model.trainable_variables
    for v in variables:
        v.assign(keras.ops.ones(v.shape))
    rule.apply([keras.ops.zeros(v.shape) for v in variables], variables)
    for v in variables:
        decayed = v.path.endswith("kernel")
        np.testing.assert_allclose(keras.ops.convert_to_numpy(v),
                                   1.0 - 0.1 * 0.5 if decayed else 1.0,
                                   rtol=1e-6, err_msg=v.path)


def test_exclude_bias_and_norm_after_build_is_an_error():
    model = conv_bn_model()
    optimizer = keras.optimizers.AdamW(0.1)
    optimizer.build(model.trainable_variables)
    with pytest.raises(ValueError, match="before the optimizer is built"):
        klb.exclude_bias_and_norm(optimizer, model)


@pytest.mark.parametrize("cls", [klb.LARSMixed, klb.LAMBMixed])
@pytest.mark.parametrize("excluded_by", ["var_list", "var_names"])
def test_keras_exclusions_reach_float16_weights_updated_through_float32_masters(
        cls, excluded_by, apply_step):
    # The rule is built on float32 masters; Keras' exclusion names the
    # float16 variables (Keras 3.16 records it per variable key at `build`).
    first, second = (keras.Variable(np.ones((2, 3), "float16"), dtype="float16", name=name)
                     for name in ("first", "second"))
    optimizer = cls(0.1, weight_decay=0.5, initial_scale=8.0)
    if excluded_by == "var_list":
        optimizer.exclude_from_weight_decay(var_list=[first])
    else:
        optimizer.exclude_from_weight_decay(var_names=["^fir"])
    zeros = [np.zeros((2, 3), "float16")] * 2
    apply_step(optimizer, zeros, [first, second])
    # A zero gradient moves only a decayed weight.
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(first), 1.0)
    assert np.all(keras.ops.convert_to_numpy(second) < 1.0)
