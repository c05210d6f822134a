"""Fashion-MNIST from IDX files: offline first, the published split."""

import csv
import gzip
import os
import struct

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytestmark = pytest.mark.tensorflow

from keras_largebatch.train import data  # noqa: E402
from keras_largebatch.train.run import driver as train_main  # noqa: E402

DEBIAN = "/usr/share/datasets/fashion-mnist"


def _idx_bytes(array):
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 0x08, array.ndim])
    header += b"".join(struct.pack(">i", d) for d in array.shape)
    return header + array.tobytes()


def _write_fashion(folder, n_train=40, n_test=20, size=28, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, size, size)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, size, size)),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) * 3) % 10,
    }
    for name, array in arrays.items():
        raw = _idx_bytes(array)
        path = os.path.join(folder, name + ".gz")
        with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
            f.write(raw)
    return {k: np.asarray(v, np.uint8) for k, v in arrays.items()}


def test_idx_files_read_back_exactly(tmp_path):
    array = np.random.default_rng(1).integers(0, 256, (5, 7, 3))
    (tmp_path / "a.idx").write_bytes(_idx_bytes(array))
    with gzip.open(tmp_path / "a.idx.gz", "wb") as f:
        f.write(_idx_bytes(array))
    for name in ("a.idx", "a.idx.gz"):
        out = data.read_idx(str(tmp_path / name))
        assert out.dtype == np.uint8 and out.shape == (5, 7, 3)
        np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize(
    "raw,match",
    [(b"", "not an IDX file"),
     (bytes([0, 0, 0x0D, 1]) + struct.pack(">i", 2) + b"\0" * 8,
      "not an IDX file of unsigned bytes"),
     (bytes([0, 0, 0x08, 2]) + struct.pack(">ii", 3, 4) + b"\0" * 11,
      "shape \\(3, 4\\).*11 bytes")],
)
def test_bad_idx_files_are_named(tmp_path, raw, match):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(raw)
    with pytest.raises(data.DataError, match=match) as info:
        data.read_idx(str(path))
    assert str(path) in str(info.value)


def test_data_dir_is_read_with_the_files_split_and_one_channel(tmp_path):
    arrays = _write_fashion(str(tmp_path))
    spec = data.load("fashion_mnist", 28, data_dir=str(tmp_path),
                     channels=None)
    assert (spec.num_train, spec.num_validation, spec.num_classes,
            spec.channels) == (40, 20, 10, 1)
    x, y = next(iter(spec.validation.batch(20)))
    np.testing.assert_allclose(
        x.numpy()[..., 0], arrays["t10k-images-idx3-ubyte"] / 255.0,
        rtol=1e-6)
    np.testing.assert_array_equal(
        np.argmax(y.numpy(), 1), arrays["t10k-labels-idx1-ubyte"])
    rgb = data.load("fashion_mnist", 32, data_dir=str(tmp_path))
    x, _ = next(iter(rgb.train.batch(2)))
    assert x.shape == (2, 32, 32, 3) and rgb.channels == 3
    np.testing.assert_array_equal(x[..., 0], x[..., 2])


def test_debian_folder_comes_before_keras_cache(tmp_path, monkeypatch):
    debian, cache = tmp_path / "debian", tmp_path / "cache"
    _write_fashion(str(debian), n_train=10, seed=1)
    _write_fashion(str(cache), n_train=30, seed=2)
    monkeypatch.setattr(data.loaders, "FASHION_MNIST_DIRS",
                        (str(debian), str(cache)))
    (x, _), _ = data.load_fashion_mnist_arrays()
    assert len(x) == 10
    os.remove(debian / "t10k-labels-idx1-ubyte.gz")  # incomplete: skipped
    (x, _), _ = data.load_fashion_mnist_arrays()
    assert len(x) == 30


def test_nothing_found_and_no_download_names_the_three_places(
        tmp_path, monkeypatch):
    import keras

    monkeypatch.setattr(data.loaders, "FASHION_MNIST_DIRS",
                        (str(tmp_path / "a"), str(tmp_path / "b")))

    def offline():
        raise OSError("no network")

    monkeypatch.setattr(keras.datasets.fashion_mnist, "load_data", offline)
    with pytest.raises(data.DataError) as info:
        data.load_fashion_mnist_arrays()
    message = str(info.value)
    for place in (str(tmp_path / "a"), str(tmp_path / "b"),
                  "keras.datasets.fashion_mnist", "dataset-fashion-mnist"):
        assert place in message


def test_mismatched_images_and_labels_are_refused(tmp_path):
    _write_fashion(str(tmp_path))
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(_idx_bytes(np.zeros(39)))
    with pytest.raises(data.DataError, match="disagree"):
        data.load_fashion_mnist_arrays(str(tmp_path))


def test_data_dir_without_the_files_is_refused(tmp_path):
    with pytest.raises(data.DataError, match="`data_dir` must hold"):
        data.load_fashion_mnist_arrays(str(tmp_path))


@pytest.mark.skipif(not os.path.isdir(DEBIAN),
                    reason="apt-get install dataset-fashion-mnist")
def test_debian_package_gives_the_published_60000_10000_split():
    (x, y), (xt, yt) = data.load_fashion_mnist_arrays()
    assert x.shape == (60_000, 28, 28) and xt.shape == (10_000, 28, 28)
    np.testing.assert_array_equal(np.bincount(y), [6_000] * 10)
    np.testing.assert_array_equal(np.bincount(yt), [1_000] * 10)


def test_command_trains_resnet_cifar_on_fashion_mnist_files(tmp_path):
    import json

    _write_fashion(str(tmp_path / "fm"), n_train=64, n_test=16)
    args = ["keras-largebatch-train", "--model=resnet_cifar",
            "--resnet_depth=8", "--resnet_width=4", "--dataset=fashion_mnist",
            f"--data_dir={tmp_path / 'fm'}", "--global_batch_size=32",
            "--gradient_accumulation_steps=2", "--epochs=2", "--verbose=0",
            "--augment=none", f"--model_dir={tmp_path / 'run'}"]
    assert train_main.main(args) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # MLPerf's table (10 at 4,096), by the square root below 4,096; its
    # warmup is 5/42 of the run.
    peak = 10.0 * (32 / 4096) ** 0.5
    assert summary["peak_learning_rate"] == pytest.approx(peak)
    assert summary["lr_rule"] == "mlperf"
    assert summary["warmup_epochs"] == pytest.approx(2 * 5 / 42)
    assert summary["image_size"] == 28 and summary["num_train"] == 64
    # Keras calls the schedule with its batch counter: 4 batches of 16 an
    # epoch, 8 in all, warmup round(4 * 2 * 5 / 42) = 1 batch. After epoch
    # 1 (batch 4) the rate is 1e-4 + (peak - 1e-4) * (1 - 3 / 7) ** 2; a
    # schedule counted in updates (2 an epoch) would already be at 1e-4.
    with open(tmp_path / "run" / "history.csv") as f:
        rates = [float(row["learning_rate"]) for row in csv.DictReader(f)]
    expected = 1e-4 + (peak - 1e-4) * (1 - 3 / 7) ** 2
    assert rates[0] == pytest.approx(expected, rel=1e-5)
