"""Names, slot names, `loss_scale_factor` and `build` behave as Keras' do."""

import keras
import numpy as np
import pytest

import keras_largebatch as klb

OPTIMIZERS = {
    "LARS": (klb.LARS, "lars"),
    "LARSMixed": (klb.LARSMixed, "lars_mixed"),
    "LAMB": (klb.LAMB, "lamb"),
    "LAMBMixed": (klb.LAMBMixed, "lamb_mixed"),
}


def two_dense_model():
    return keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, name="first"),
        keras.layers.Dense(2, name="second"),
    ])


@pytest.mark.parametrize("cls, prefix", OPTIMIZERS.values(), ids=OPTIMIZERS)
def test_default_names_are_unique_like_keras_sgd(cls, prefix):
    keras.backend.clear_session()
    sgd = [keras.optimizers.SGD(0.1).name for _ in range(3)]
    ours = [cls(0.1).name for _ in range(3)]
    assert sgd == ["sgd", "sgd_1", "sgd_2"]
    assert ours == [prefix, f"{prefix}_1", f"{prefix}_2"]
    assert cls(0.1, name="chosen").name == "chosen"


def test_mixed_optimizers_take_no_name_from_users_optimizers():
    keras.backend.clear_session()
    klb.LARSMixed(0.1)
    klb.LAMBMixed(0.1)
    assert klb.LARS(0.1).name == "lars"
    assert klb.LAMB(0.1).name == "lamb"


SLOTS = {  # ours: the Keras optimizer whose slot names they follow
    "LARS": (lambda: klb.LARS(0.1), lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
    "LARSMixed": (lambda: klb.LARSMixed(0.1), lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
    "LAMB": (lambda: klb.LAMB(0.1), lambda: keras.optimizers.Lamb(0.1)),
    "LAMBMixed": (lambda: klb.LAMBMixed(0.1), lambda: keras.optimizers.Lamb(0.1)),
}


@pytest.mark.parametrize("policy", ["float32", "float16"])
@pytest.mark.parametrize("make, make_keras", SLOTS.values(), ids=SLOTS)
def test_slot_names_come_from_variable_paths(make, make_keras, policy):
    keras.config.set_dtype_policy(policy)
    model = two_dense_model()
    optimizer, reference = make(), make_keras()
    optimizer.build(model.trainable_variables)
    reference.build(model.trainable_variables)
    slot = ("_momentum", "_velocity")
    names = [v.name for v in optimizer.variables]
    expected = [v.name for v in reference.variables if v.name.endswith(slot)]
    assert "sequential_first_kernel_momentum" in expected
    assert sorted(n for n in names if n.endswith(slot)) == sorted(expected)
    masters = [n for n in names if n.endswith("_master")]
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and policy == "float16":
        assert masters == [
            "sequential_first_kernel_master", "sequential_first_bias_master",
            "sequential_second_kernel_master", "sequential_second_bias_master",
        ]
    else:
        assert masters == []


@pytest.mark.parametrize("cls", [klb.LARSMixed, klb.LAMBMixed])
def test_mixed_optimizers_reject_loss_scale_factor(cls):
    with pytest.raises(
        ValueError, match=r"`loss_scale_factor`.*Received: loss_scale_factor=128"
    ):
        cls(0.1, loss_scale_factor=128.0)
    # The default (None) is accepted, so saved configs load back.
    assert cls(0.1, loss_scale_factor=None).inner_optimizer.loss_scale_factor is None


def test_lars_honours_loss_scale_factor_like_keras():
    # Plain LARS is a Keras optimizer: `loss_scale_factor` divides the
    # gradients before the update, as Keras' base optimizer does.
    w0 = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    g = np.random.default_rng(1).normal(size=(3, 4)).astype("float32") * 1e-3
    scaled, plain = keras.Variable(w0), keras.Variable(w0)
    klb.LARS(0.1, eta=0.01, weight_decay=1e-3, loss_scale_factor=64.0).apply(
        [g * 64.0], [scaled]
    )
    klb.LARS(0.1, eta=0.01, weight_decay=1e-3).apply([g], [plain])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(scaled), keras.ops.convert_to_numpy(plain),
        rtol=1e-6,
    )


@pytest.mark.parametrize("cls", [klb.LARS, klb.LARSMixed, klb.LAMB, klb.LAMBMixed],
                         ids=["LARS", "LARSMixed", "LAMB", "LAMBMixed"])
def test_second_build_returns_early(cls, apply_step):
    keras.config.set_dtype_policy("float16")
    model = two_dense_model()
    variables = model.trainable_variables
    kwargs = {"initial_scale": 1.0} if cls in (klb.LARSMixed, klb.LAMBMixed) else {}
    if cls in (klb.LARS, klb.LARSMixed):
        kwargs.update(momentum=0.9, eta=0.01)
    optimizer = cls(0.1, **kwargs)
    optimizer.build(variables)
    before = list(optimizer.variables)
    optimizer.build(variables)
    assert len(optimizer.variables) == len(before)
    assert all(a is b for a, b in zip(optimizer.variables, before))
    # A step still moves the weights, through masters the inner optimizer
    # knows (a second set would leave the model's variables unchanged).
    start = [keras.ops.convert_to_numpy(v).astype("float32") for v in variables]
    grads = [np.full(v.shape, 1e-2, "float16") for v in variables]
    apply_step(optimizer, grads, variables)
    for v, w in zip(variables, start):
        assert not np.array_equal(keras.ops.convert_to_numpy(v).astype("float32"), w)
    masters = [v for v in optimizer.variables if v.name.endswith("_master")]
    mixed = cls in (klb.LARSMixed, klb.LAMBMixed)
    assert len(masters) == (len(variables) if mixed else 0)
    for m, v in zip(masters, variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(m).astype("float16"), keras.ops.convert_to_numpy(v)
        )
