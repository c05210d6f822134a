"""The recipe: learning-rate scaling, schedule, optimizers, model, weights."""

import dataclasses

import keras
import numpy as np
import pytest

import keras_largebatch
from keras_largebatch.train import config as train_config
from keras_largebatch.train.recipe import models
from keras_largebatch.train.recipe import optimizers
from keras_largebatch.train.recipe import rates
from keras_largebatch.train.data import registry


def _alexnet_bn_params(size, classes):
    # conv (k*k*cin/groups*cout + cout), BN (4 * c), dense (in*out + out).
    conv = [(11, 3, 96, 1), (5, 96, 256, 2), (3, 256, 384, 1),
            (3, 384, 384, 2), (3, 384, 256, 2)]
    total = sum(k * k * cin // g * cout + cout for k, cin, cout, g in conv)
    total += 4 * (96 + 256 + 384 + 384 + 256)
    side = ((size - 11) // 4 + 1 - 3) // 2 + 1
    side = (side - 3) // 2 + 1
    side = (side - 3) // 2 + 1
    flat = side * side * 256
    return total + flat * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * classes + classes


def test_alexnet_bn_at_its_minimum_input_has_the_expected_parameters():
    model = models.build_model("alexnet_bn", 67, 10, bn_momentum=0.9)
    assert model.count_params() == _alexnet_bn_params(67, 10) == 20_214_538
    bns = [l for l in model.layers
           if isinstance(l, keras.layers.BatchNormalization)]
    assert len(bns) == 5 and all(l.momentum == 0.9 for l in bns)


def _last_gammas(tmp_path, zero_init_residual, model="resnet50"):
    config = train_config.parse(
        ["prog", f"--model_dir={tmp_path}", f"--model={model}",
         f"--zero_init_residual={zero_init_residual}"])
    spec = dataclasses.make_dataclass(
        "Spec", ["image_size", "num_classes", "channels"])(32, 10, 3)
    model = models.build_network(config.network, spec)
    return [keras.ops.convert_to_numpy(layer.gamma) for layer in model.layers
            if layer.name.endswith("_3_bn")]


def test_zero_init_residual_starts_each_blocks_last_gamma_at_zero(
        tmp_path):
    zeroed = _last_gammas(tmp_path, True, "resnet50_v1_5")
    assert len(zeroed) == 16 and not any(g.any() for g in zeroed)
    assert all((g == 1).all() for g in _last_gammas(tmp_path, False))
    with pytest.raises(ValueError, match="`zero_init_residual` must be "
                       "false unless --model is resnet50"):
        _last_gammas(tmp_path, True, "alexnet_bn")


def test_unknown_model_names_the_argument():
    with pytest.raises(ValueError, match="`model`.*Received: model='vgg16'"):
        models.build_model("vgg16", 32, 10)


@pytest.mark.parametrize(
    "optimizer,batch,scaling,expected",
    [("sgd", 32, "linear", 0.1 * 32 / 256),
     ("sgd", 1024, "linear", 0.1 * 4),
     ("lars_mixed", 512, "sqrt", 2.0 * np.sqrt(2.0)),
     ("lars", 512, "none", 2.0)],
)
def test_peak_learning_rate_scales_the_default_base_rate(
        optimizer, batch, scaling, expected):
    peak = rates.peak_learning_rate(optimizer, 0.0, batch, 256, scaling)
    assert peak == pytest.approx(expected)


def test_schedule_warms_up_then_decays_to_the_end_rate():
    lr = rates.schedule(0.8, steps_per_epoch=10, epochs=5, warmup_epochs=1,
                         end_learning_rate=1e-4, power=2.0)
    assert (lr.warmup_steps, lr.decay_steps) == (10, 40)
    values = [float(lr(s)) for s in (0, 5, 10, 30, 50)]
    expected = [0.0, 0.4, 0.8, 1e-4 + (0.8 - 1e-4) * 0.5 ** 2, 1e-4]
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-7)


def test_sgd_never_decays_biases_or_batch_norm():
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(3),
        keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    opt = optimizers.build_optimizer("sgd", 0.1, model, weight_decay=0.5)
    # One step with zero gradients (Keras' public `apply`, which builds the
    # optimizer first, as Keras 3.16 requires): only decay moves a weight,
    # by lr * wd = 5% of its value. Every weight starts at 1, so a decayed
    # bias or BN parameter would move too.
    for v in model.trainable_variables:
        v.assign(np.ones(v.shape))
    opt.apply([keras.ops.zeros(v.shape, "float32")
               for v in model.trainable_variables], model.trainable_variables)
    decayed = [v.path for v in model.trainable_variables
               if not np.allclose(keras.ops.convert_to_numpy(v), 1.0)]
    assert decayed == [model.layers[0].kernel.path,
                       model.layers[2].kernel.path]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.layers[0].kernel), 0.95, rtol=1e-6)


def test_lars_mixed_gets_eta_and_weight_decay():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = optimizers.build_optimizer("lars_mixed", 0.1, model, eta=0.002,
                                 weight_decay=1e-4)
    assert isinstance(opt, keras_largebatch.LARSMixed)
    config = opt.inner_optimizer.get_config()
    assert config["eta"] == 0.002 and config["weight_decay"] == 1e-4


def test_init_weights_of_another_architecture_is_rejected(tmp_path):
    other = keras.Sequential([keras.Input((67, 67, 3)),
                              keras.layers.Conv2D(4, 3, name="conv1")])
    path = str(tmp_path / "other.weights.h5")
    other.save_weights(path)
    model = models.build_model("alexnet_bn", 67, 10)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match="other.weights.h5"):
        models.load_init_weights(model, path)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_init_weights_with_other_classes_loads_all_but_the_classifier(
        tmp_path, suffix):
    # .keras: another run's final.keras (a model without optimizer).
    source = models.build_model("alexnet_bn", 67, 7)
    path = str(tmp_path / f"source{suffix}")
    if suffix == ".keras":
        source.save(path)
    else:
        source.save_weights(path)
    model = models.build_model("alexnet_bn", 67, 3)
    head = model.get_layer("predictions").get_weights()[0].copy()
    models.load_init_weights(model, path)
    np.testing.assert_array_equal(model.get_layer("fc7").get_weights()[0],
                                  source.get_layer("fc7").get_weights()[0])
    np.testing.assert_array_equal(
        model.get_layer("predictions").get_weights()[0], head)


@pytest.mark.parametrize(
    "batch,peak,warmup_fraction",
    [(32, 10.0 * (32 / 4096) ** 0.5, 5 / 42),
     (1024, 5.0, 5 / 42), (4096, 10.0, 5 / 42), (16_383, 10.0, 5 / 42),
     (16_384, 25.0, 5 / 42), (32_767, 25.0, 5 / 42),
     (32_768, 31.2, 25 / 90), (65_536, 31.2, 25 / 90)],
)
def test_mlperf_table_gives_peak_and_warmup_by_global_batch(
        batch, peak, warmup_fraction):
    assert keras_largebatch.mlperf_lars_rate(batch) == pytest.approx(
        (peak, warmup_fraction))


@pytest.mark.parametrize("optimizer", ["lars", "lars_mixed"])
def test_lars_defaults_follow_the_table_not_linear_scaling(optimizer):
    # Linear scaling from 2.0 per 256 would give 256 at 32K.
    assert rates.peak_learning_rate(optimizer, 0.0, 32_768) == 31.2
    assert rates.peak_learning_rate(optimizer, 0.0, 4096) == 10.0
    assert rates.warmup_epochs_for(optimizer, "auto", 65_536, 90) == (
        pytest.approx(25.0))
    assert rates.warmup_epochs_for(optimizer, "auto", 4096, 8) == (
        pytest.approx(8 * 5 / 42))


def test_sgd_default_is_goyals_linear_rule_and_warmup():
    assert rates.lr_rule("sgd") == "linear"
    assert rates.peak_learning_rate("sgd", 0.0, 4096) == pytest.approx(1.6)
    assert rates.warmup_epochs_for("sgd", "auto", 4096, 90) == (
        pytest.approx(5.0))
    assert rates.warmup_epochs_for("sgd", "auto", 4096, 8, 2.0) == 2.0


def test_mlperf_rule_refuses_sgd_and_an_unused_base_rate():
    with pytest.raises(ValueError, match="optimizer=sgd"):
        rates.peak_learning_rate("sgd", 0.0, 4096, scaling="mlperf")
    with pytest.raises(ValueError, match="Received: base_learning_rate=3.0"):
        rates.peak_learning_rate("lars", 3.0, 4096, scaling="mlperf")


@pytest.mark.parametrize("batch", [0, -4, 1.5, "4096"])
def test_mlperf_rate_rejects_a_bad_batch(batch):
    with pytest.raises(ValueError, match="`global_batch_size`.*Received"):
        keras_largebatch.mlperf_lars_rate(batch)


@pytest.mark.parametrize("name", ["sgd", "lars", "lars_mixed"])
def test_gradient_accumulation_reaches_the_optimizer(name):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = optimizers.build_optimizer(name, 0.1, model,
                                 gradient_accumulation_steps=4)
    inner = getattr(opt, "inner_optimizer", opt)
    assert inner.gradient_accumulation_steps == 4


def test_resnet_cifar_keeps_the_data_size_and_channels():
    fashion, synthetic = (registry.native_size(name)
                          for name in ("fashion_mnist", "synthetic"))
    assert models.image_size_for("resnet_cifar", fashion) == 28
    assert models.image_size_for("resnet_cifar", synthetic) == 32
    assert models.image_size_for("resnet50", fashion) == 32
    assert models.input_channels("resnet_cifar") is None
    model = models.build_model("resnet_cifar", 28, 10, 0.9, channels=1,
                               depth=8, width=4)
    assert model.input_shape == (None, 28, 28, 1)


@pytest.mark.parametrize("name,cls", [("lamb", "LAMB"),
                                      ("lamb_mixed", "LAMBMixed")])
def test_lamb_optimizers_are_built_with_sqrt_scaling(name, cls):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = optimizers.build_optimizer(name, 0.01, model, weight_decay=1e-4)
    assert isinstance(opt, getattr(keras_largebatch, cls))
    inner = getattr(opt, "inner_optimizer", opt)
    assert inner.get_config()["weight_decay"] == 1e-4
    assert rates.lr_rule(name) == "sqrt"
    assert rates.peak_learning_rate(name, 0.0, 1024) == pytest.approx(0.004)
    with pytest.raises(ValueError, match="optimizer=" + name):
        rates.peak_learning_rate(name, 0.0, 1024, scaling="mlperf")


def test_compile_run_builds_the_optimizer_compile_made_and_the_rule():
    """Under mixed_float16 Keras wraps SGD in a LossScaleOptimizer at
    compile: its state (the loss scale, the inner momenta) is what the
    first checkpoint holds, so that is what must be built; the schedule
    carries the rule that gave its peak."""
    from keras_largebatch.train.config import RunConfig

    config = RunConfig.default()
    optimization = dataclasses.replace(config.optimization, optimizer="sgd")
    training = dataclasses.replace(config.training, global_batch_size=512)
    schedule = rates.plan(config.learning_rate, training, "sgd", 10)
    assert schedule.rule == "linear"
    assert schedule.peak == pytest.approx(0.1 * 512 / 256)
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        optimizers.compile_run(model, optimization, schedule, 1)
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.optimizer.built and model.optimizer.inner_optimizer.built
