"""Every bad constructor argument gets a ValueError naming it and its value."""

import pytest

import keras_largebatch as klb


@pytest.mark.parametrize("cls", [klb.LARS, klb.LARSMixed])
@pytest.mark.parametrize(
    "kwargs, argument, shown",
    [
        ({"learning_rate": 0.0}, "learning_rate", "learning_rate=0.0"),
        ({"learning_rate": -1.0}, "learning_rate", "learning_rate=-1.0"),
        ({"momentum": 1.0}, "momentum", "momentum=1.0"),
        ({"momentum": -0.1}, "momentum", "momentum=-0.1"),
        ({"eta": 0.0}, "eta", "eta=0.0"),
        ({"eta": -0.001}, "eta", "eta=-0.001"),
        ({"epsilon": -1e-9}, "epsilon", "epsilon=-1e-09"),
        ({"weight_decay": -1e-4}, "weight_decay", "weight_decay=-0.0001"),
        ({"nesterov": True, "momentum": 0.0}, "nesterov", "nesterov=True"),
        ({"exclude_from_weight_decay": "bias"}, "exclude_from_weight_decay",
         "exclude_from_weight_decay='bias'"),
        ({"exclude_from_layer_adaptation": ["("]}, "exclude_from_layer_adaptation",
         "exclude_from_layer_adaptation=['(']"),
    ],
)
def test_bad_hyperparameter_is_named_with_its_value(cls, kwargs, argument, shown):
    kwargs = {"learning_rate": 0.1, **kwargs}
    with pytest.raises(ValueError, match=rf"`{argument}`") as info:
        cls(**kwargs)
    assert f"Received: {shown}" in str(info.value) or shown in str(info.value)


@pytest.mark.parametrize("cls", [klb.LAMB, klb.LAMBMixed])
@pytest.mark.parametrize(
    "kwargs, argument, shown",
    [
        ({"learning_rate": 0.0}, "learning_rate", "learning_rate=0.0"),
        ({"learning_rate": -1e-3}, "learning_rate", "learning_rate=-0.001"),
        ({"beta_1": 1.0}, "beta_1", "beta_1=1.0"),
        ({"beta_1": -0.1}, "beta_1", "beta_1=-0.1"),
        ({"beta_2": 1.0}, "beta_2", "beta_2=1.0"),
        ({"beta_2": "0.99"}, "beta_2", "beta_2='0.99'"),
        ({"epsilon": 0.0}, "epsilon", "epsilon=0.0"),
        ({"weight_decay": -1e-4}, "weight_decay", "weight_decay=-0.0001"),
        ({"trust_clip": 1}, "trust_clip", "trust_clip=1"),
        ({"exclude_from_weight_decay": "bias"}, "exclude_from_weight_decay",
         "exclude_from_weight_decay='bias'"),
        ({"exclude_from_layer_adaptation": [3]}, "exclude_from_layer_adaptation",
         "exclude_from_layer_adaptation=[3]"),
    ],
)
def test_bad_lamb_argument_is_named_with_its_value(cls, kwargs, argument, shown):
    kwargs = {"learning_rate": 1e-3, **kwargs}
    with pytest.raises(ValueError, match=rf"`{argument}`") as info:
        cls(**kwargs)
    assert f"Received: {shown}" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"initial_scale": 0.0}, "initial_scale"),
        ({"dynamic_growth_steps": 0}, "dynamic_growth_steps"),
        ({"dynamic_growth_steps": 2.5}, "dynamic_growth_steps"),
        ({"loss_scale_factor": 8.0}, "loss_scale_factor"),
    ],
)
@pytest.mark.parametrize("cls", [klb.LARSMixed, klb.LAMBMixed])
def test_bad_loss_scale_argument_is_named(cls, kwargs, argument):
    with pytest.raises(ValueError, match=rf"`{argument}`.*Received: {argument}="):
        cls(0.1, **kwargs)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"peak_learning_rate": 0.0}, "peak_learning_rate"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"decay_steps": 0}, "decay_steps"),
        ({"end_learning_rate": -0.1}, "end_learning_rate"),
        ({"power": 0.0}, "power"),
        ({"initial_learning_rate": -1.0}, "initial_learning_rate"),
    ],
)
def test_bad_schedule_argument_is_named(kwargs, argument):
    args = {"peak_learning_rate": 1.0, "warmup_steps": 2, "decay_steps": 10, **kwargs}
    with pytest.raises(ValueError, match=rf"`{argument}`.*Received: {argument}="):
        klb.WarmupPolynomialDecay(**args)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"base_batch_size": 0}, "base_batch_size"),
        ({"base_learning_rate": 0.0}, "base_learning_rate"),
        ({"rule": "cubic"}, "rule"),
    ],
)
def test_bad_scaling_argument_is_named(kwargs, argument):
    args = {"base_learning_rate": 0.1, "batch_size": 1024, **kwargs}
    with pytest.raises(ValueError, match=rf"`{argument}`.*Received: {argument}="):
        klb.scale_learning_rate(**args)
