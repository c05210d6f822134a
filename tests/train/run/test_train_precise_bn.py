"""Precise batch-norm statistics, against an independent float64 forward."""

import json
import os

import keras
import numpy as np
import pytest

import keras_largebatch
from keras_largebatch.precise_bn import recompute_batch_norm_statistics

EPS = 1e-3


def dense_bn_model():
    """Dense -> BN -> ReLU -> Dense -> BN -> Dense, and a frozen BN."""
    inputs = keras.Input((6,))
    x = keras.layers.Dense(5, name="d1")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=EPS,
                                        name="bn1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Dense(4, name="d2")(x)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=EPS,
                                        name="bn2")(x)
    frozen = keras.layers.BatchNormalization(name="frozen")
    x = frozen(x)
    frozen.trainable = False
    outputs = keras.layers.Dense(3, name="head")(x)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(7)
    # Non-trivial gamma/beta so the second layer's input depends on them.
    for name in ("bn1", "bn2"):
        layer = model.get_layer(name)
        layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape))
        layer.beta.assign(rng.uniform(-0.3, 0.3, layer.beta.shape))
    return model


def reference(model, batches):
    """float64 numpy: per-batch training-mode statistics, averaged."""
    w = {n: [np.asarray(keras.ops.convert_to_numpy(v), np.float64)
             for v in model.get_layer(n).weights]
         for n in ("d1", "d2", "bn1", "bn2")}
    stats = {"bn1": [0, 0], "bn2": [0, 0]}
    for x in batches:
        h1 = x.astype(np.float64) @ w["d1"][0] + w["d1"][1]
        m1, v1 = h1.mean(0), h1.var(0)
        gamma, beta = w["bn1"][0], w["bn1"][1]
        a1 = np.maximum(gamma * (h1 - m1) / np.sqrt(v1 + EPS) + beta, 0)
        h2 = a1 @ w["d2"][0] + w["d2"][1]
        m2, v2 = h2.mean(0), h2.var(0)
        for name, m, v in (("bn1", m1, v1), ("bn2", m2, v2)):
            stats[name][0] += m / len(batches)
            stats[name][1] += v / len(batches)
    return stats


def data(num, batch=32, seed=3):
    rng = np.random.default_rng(seed)
    # Batches whose statistics differ (shifted per batch), as over training.
    return [(rng.normal(size=(batch, 6)) * rng.uniform(0.5, 2)
             + rng.normal(size=6)).astype("float32") for _ in range(num)]


def bn_state(model, name):
    layer = model.get_layer(name)
    return (keras.ops.convert_to_numpy(layer.moving_mean).copy(),
            keras.ops.convert_to_numpy(layer.moving_variance).copy())


def test_statistics_are_the_average_of_batch_statistics():
    model = dense_bn_model()
    batches = data(7)
    # Moving averages from other data first: they must be replaced, not mixed.
    for x in data(5, seed=11):
        model(x, training=True)
    frozen = bn_state(model, "frozen")
    expected = reference(model, batches)
    ema = {n: bn_state(model, n) for n in ("bn1", "bn2")}

    assert recompute_batch_norm_statistics(
        model, [(x, np.zeros(len(x))) for x in batches] + data(3, seed=5),
        num_batches=7) == 2

    for name in ("bn1", "bn2"):
        mean, var = bn_state(model, name)
        np.testing.assert_allclose(mean, expected[name][0], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(var, expected[name][1], rtol=1e-5)
        # The exponential average of the other data is far from it.
        assert np.max(np.abs(ema[name][0] - expected[name][0])) > 0.05
        assert model.get_layer(name).momentum == 0.9
    for got, want in zip(bn_state(model, "frozen"), frozen):
        np.testing.assert_array_equal(got, want)


def test_too_few_batches_raise_and_leave_the_statistics():
    model = dense_bn_model()
    for x in data(3, seed=11):
        model(x, training=True)
    before = {n: bn_state(model, n) for n in ("bn1", "bn2")}
    with pytest.raises(ValueError, match=r"num_batches=5.*|holds \(3"):
        recompute_batch_norm_statistics(model, data(3), num_batches=5)
    for name in ("bn1", "bn2"):
        for got, want in zip(bn_state(model, name), before[name]):
            np.testing.assert_array_equal(got, want)
        assert model.get_layer(name).momentum == 0.9


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "8"])
def test_num_batches_is_checked(bad):
    with pytest.raises(ValueError, match="num_batches"):
        keras_largebatch.PreciseBatchNorm(data(2), num_batches=bad)
    with pytest.raises(ValueError, match="num_batches"):
        recompute_batch_norm_statistics(dense_bn_model(), data(2), bad)


def test_callback_sets_precise_statistics_before_validation_in_fit():
    model = dense_bn_model()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype("float32") * 3 + 1
    y = rng.normal(size=(96, 3)).astype("float32")
    calibration = data(4, seed=21)
    seen_epochs = []

    def batches(epoch):
        seen_epochs.append(epoch)
        return calibration

    class Capture(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            # After validation: what validation used and the checkpoint holds.
            self.stats = {n: bn_state(self.model, n) for n in ("bn1", "bn2")}
            self.expected = reference(self.model, calibration)

    capture = Capture()
    model.fit(x, y, batch_size=32, epochs=2, validation_data=(x, y),
              verbose=0, callbacks=[
                  keras_largebatch.PreciseBatchNorm(batches, num_batches=4),
                  capture])
    assert seen_epochs == [0, 1]
    for name in ("bn1", "bn2"):
        np.testing.assert_allclose(capture.stats[name][0],
                                   capture.expected[name][0], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(capture.stats[name][1],
                                   capture.expected[name][1], rtol=1e-5)


# The command: `--precise_bn_batches`.

TINY = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=8",
        "--steps_per_epoch=2", "--verbose=0", "--augment=none",
        "--warmup_epochs=0", "--image_size=67"]


def _run(*args):
    from keras_largebatch.train.run import driver as train_main

    return train_main.main(["keras-largebatch-train", *args])


def test_command_checkpoints_hold_the_precise_statistics(small, tmp_path):
    from keras_largebatch.train import data

    model_dir = tmp_path / "run"
    assert _run(*TINY, "--epochs=2", "--precise_bn_batches=3",
                f"--model_dir={model_dir}") == 0
    model = keras.saving.load_model(model_dir / "final.keras")
    # The batches of the last epoch (index 1), seed + 1, as documented; the
    # statistics of bn1's input (conv1's output) computed here in float64.
    spec = data.load("synthetic", 67, None, 3, 0, False, 3, (0, 0), None)
    # The command's pipeline: tf.data on TensorFlow, Grain elsewhere.
    if keras.backend.backend() == "tensorflow":
        build = data.batch
    else:
        from keras_largebatch.train.data import grain_pipeline

        build = grain_pipeline.batch
    batches, _ = build(spec, 8, None, 1, drop_remainder=True,
                       steps_per_epoch=3, epochs=2, initial_epoch=1)
    conv = keras.Model(model.input, model.get_layer("conv1").output)
    means, variances = [], []
    for x, _ in batches:
        # final.keras takes the data set's own images and scales them to
        # [-1, 1] itself (issue #61): the pipeline's batches, mapped back.
        raw = (np.asarray(x) / 2.0 + 0.5) * spec.raw.max_value
        h = np.asarray(keras.ops.convert_to_numpy(
            conv(raw, training=False)), np.float64)
        means.append(h.mean((0, 1, 2)))
        variances.append(h.var((0, 1, 2)))
    assert len(means) == 3
    mean, var = bn_state(model, "bn1")
    np.testing.assert_allclose(mean, np.mean(means, 0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(var, np.mean(variances, 0), rtol=1e-4)

    # --mode=eval recomputes from the same batches: the same accuracy.
    summary = json.loads((model_dir / "summary.json").read_text())
    assert _run(f"--model_dir={model_dir}", "--mode=eval") == 0
    result = json.loads((model_dir / "eval.json").read_text())
    assert result["precise_bn_batches"] == 3
    assert result["val_accuracy"] == pytest.approx(summary["val_accuracy"])


@pytest.mark.parametrize("args,expected", [
    (["--precise_bn_batches=-1"], "precise_bn_batches=-1"),
    (["--precise_bn_batches=4", "--distribution=multi_worker"],
     "precise_bn_batches=4"),
])
def test_command_refuses_bad_precise_bn_batches(args, expected, tmp_path,
                                                capsys, monkeypatch):
    from keras_largebatch.train.run import placement

    # No TF_CONFIG cluster is needed: the flag is refused first.
    monkeypatch.setattr(placement, "_multi_worker_strategy",
                        lambda flags: None)
    capsys.readouterr()
    assert _run(*TINY, *args, f"--model_dir={tmp_path}/run") == 2
    err = capsys.readouterr().err
    assert expected in err and "precise_bn_batches" in err
    assert not os.path.exists(tmp_path / "run")
