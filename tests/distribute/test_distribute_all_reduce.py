"""Fusion buckets, node topology, compression, argument checks, and the
fused all-reduce over two local devices against a NumPy float64 reference."""

import inspect
import json
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="keras_largebatch.distribute needs the TensorFlow backend",
)

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    from keras_largebatch.distribute import MultiWorkerMirroredStrategy
    from keras_largebatch.distribute import all_reduce
    from keras_largebatch.distribute import compression

WORKERS = os.path.join(os.path.dirname(__file__), "workers")


def test_buckets_fill_in_reverse_order_up_to_the_threshold():
    sizes = [512, 64, 192, 12]  # kernel1, bias1, kernel2, bias2
    f = "float32"
    assert all_reduce.assign_buckets(sizes, [f] * 4, 256) == [[3, 2], [1], [0]]
    assert all_reduce.assign_buckets(sizes, [f] * 4, 1000) == [[3, 2, 1, 0]]


def test_tensor_larger_than_threshold_travels_alone():
    buckets = all_reduce.assign_buckets([10, 100, 10], ["f"] * 3, 50)
    assert buckets == [[2], [1], [0]]


def test_zero_threshold_gives_one_bucket_per_tensor():
    assert all_reduce.assign_buckets([4, 4, 4], ["f"] * 3, 0) == [[2], [1], [0]]


def test_buckets_never_mix_dtypes():
    buckets = all_reduce.assign_buckets(
        [4, 2, 4, 2], ["float32", "float16", "float32", "float16"], 100
    )
    assert buckets == [[3, 1], [2, 0]]


def test_buckets_cover_every_tensor_once():
    rng = np.random.RandomState(0)
    sizes = rng.randint(0, 1000, size=214).tolist()
    dtypes = rng.choice(["a", "b"], size=214).tolist()
    buckets = all_reduce.assign_buckets(sizes, dtypes, 2000)
    assert sorted(i for b in buckets for i in b) == list(range(214))
    for b in buckets:
        assert len({dtypes[i] for i in b}) == 1
        assert len(b) == 1 or sum(sizes[i] for i in b) <= 2000


def test_nodes_are_tasks_sharing_a_host_by_default():
    spec = tf.train.ClusterSpec(
        {"chief": ["a:1"], "worker": ["a:2", "b:1", "b:2", "c:5"]}
    )
    assert all_reduce.node_of_tasks(spec) == [0, 0, 1, 1, 2]


def test_workers_per_node_groups_consecutive_tasks():
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{p}" for p in range(5)]})
    assert all_reduce.node_of_tasks(spec) == [0] * 5
    assert all_reduce.node_of_tasks(spec, 2) == [0, 0, 1, 1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fusion_threshold_bytes": -1}, "fusion_threshold_bytes=-1"),
        ({"fusion_threshold_bytes": 1.5}, "fusion_threshold_bytes=1.5"),
        ({"hierarchical_threshold_bytes": -8},
         "hierarchical_threshold_bytes=-8"),
        ({"hierarchical_threshold_bytes": True},
         "hierarchical_threshold_bytes=True"),
        ({"workers_per_node": 0}, "workers_per_node=0"),
        ({"compression": "int8"}, "compression='int8'"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        MultiWorkerMirroredStrategy(**kwargs)


def test_get_config_covers_every_keyword_argument():
    keyword = [
        name
        for name, p in inspect.signature(
            MultiWorkerMirroredStrategy.__init__
        ).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    fake = types.SimpleNamespace(
        _fusion_threshold_bytes=1, _hierarchical_threshold_bytes=2,
        _compression="fp16", _workers_per_node=3,
    )
    config = MultiWorkerMirroredStrategy.get_config(fake)
    assert sorted(config) == sorted(keyword)
    assert config == {
        "fusion_threshold_bytes": 1, "hierarchical_threshold_bytes": 2,
        "compression": "fp16", "workers_per_node": 3,
    }


def test_fp16_prescaling_keeps_a_large_sum_finite():
    n = 4
    x = tf.constant([60000.0, -1.5, 0.25])
    wire, context = compression.FP16Compressor.compress(x, group_size=n)
    assert wire.dtype == tf.float16
    total = tf.add_n([wire] * n)  # what the all-reduce computes
    result = compression.FP16Compressor.decompress(total, context)
    np.testing.assert_allclose(result.numpy(), [240000.0, -6.0, 1.0], rtol=1e-3)
    # Without the pre-scaling the same sum overflows float16.
    assert not np.isfinite(tf.add_n([tf.cast(x, tf.float16)] * n).numpy()[0])


def test_compressors_pass_other_dtypes_through():
    x = tf.constant([1.0, 2.0], tf.bfloat16)
    wire, context = compression.FP16Compressor.compress(x, group_size=8)
    assert wire.dtype == tf.bfloat16
    assert compression.NoneCompressor.wire_dtype(tf.float32) == tf.float32
    assert compression.get(None) is compression.NoneCompressor
    assert compression.get("fp16") is compression.FP16Compressor
    with pytest.raises(ValueError, match="compression='bf8'"):
        compression.get("bf8")


@pytest.fixture(scope="module")
def local_reduce():
    proc = subprocess.run(
        [sys.executable, os.path.join(WORKERS, "local_reduce_worker.py")],
        capture_output=True, text=True, timeout=180,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_fused_all_reduce_equals_numpy_in_float32(local_reduce, op):
    inputs = local_reduce["inputs"]
    for k, reduced in enumerate(local_reduce[f"None_{op}"]):
        expected = np.add(
            np.asarray(inputs[0][k], np.float64),
            np.asarray(inputs[1][k], np.float64),
        )
        if op == "MEAN":
            expected = expected / 2
        for on_device in reduced:  # identical on both devices
            np.testing.assert_array_equal(on_device, expected)


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_fused_all_reduce_in_fp16_within_float16_rounding(local_reduce, op):
    inputs = local_reduce["inputs"]
    for k, reduced in enumerate(local_reduce[f"fp16_{op}"]):
        expected = np.add(
            np.asarray(inputs[0][k], np.float64),
            np.asarray(inputs[1][k], np.float64),
        )
        if op == "MEAN":
            expected = expected / 2
        for on_device in reduced:
            np.testing.assert_allclose(
                on_device, expected, rtol=2e-3, atol=1e-3
            )


def test_buckets_follow_dtype_and_fp16_halves_float32_bytes(local_reduce):
    # Forward: f32[3,4], f16[5], f32[], f32[0,2], bf16[7,3]; int32 aside.
    # Reverse with 64-byte buckets: bf16 (42 B), f32 x3 (52 B), f16 (10 B).
    expected = [[1, 42, "flat"], [3, 52, "flat"], [1, 10, "flat"]]
    assert local_reduce["None_buckets"][:3] == expected
    expected[1][1] = 26
    assert local_reduce["fp16_buckets"][:3] == expected
