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
    from keras_largebatch.distribute.config import ReduceConfig

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
        ({"compression": "topk", "topk_density": 0.0}, "topk_density=0.0"),
        ({"compression": "topk", "topk_density": 1.5}, "topk_density=1.5"),
        ({"compression": "topk", "topk_density": "1%"}, "topk_density='1%'"),
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
    fake = types.SimpleNamespace(cross_device_ops=types.SimpleNamespace(
        config=ReduceConfig(
            fusion_threshold_bytes=1, hierarchical_threshold_bytes=2,
            compression="fp16", workers_per_node=3, topk_density=0.25,
            topk_error_feedback=False,
        )
    ))
    config = MultiWorkerMirroredStrategy.get_config(fake)
    assert sorted(config) == sorted(keyword)
    assert config == {
        "fusion_threshold_bytes": 1, "hierarchical_threshold_bytes": 2,
        "compression": "fp16", "workers_per_node": 3, "topk_density": 0.25,
        "topk_error_feedback": False,
    }


def test_fp16_casts_a_sum_as_it_is_and_divides_a_mean_before_the_cast():
    sum_, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
    fp16 = compression.FP16Compressor
    assert all_reduce.wire_format(tf.float32, 1, sum_, 1024, fp16) == (
        tf.float16, 1.0, 1.0
    )
    assert all_reduce.wire_format(tf.float32, 2, mean, 8, fp16) == (
        tf.float16, 0.125, 1.0
    )
    # Scalars (flags, losses) and uncompressed tensors in full precision.
    assert all_reduce.wire_format(tf.float32, 0, sum_, 8, fp16) == (
        tf.float32, 1.0, 1.0
    )
    assert all_reduce.wire_format(tf.float32, 1, mean, 8, None) == (
        tf.float32, 1.0, 0.125
    )


def test_compressors_cast_float32_and_pass_other_dtypes_through():
    assert compression.FP16Compressor.wire_dtype(tf.bfloat16) == tf.bfloat16
    assert compression.FP16Compressor.wire_dtype(tf.float64) == tf.float64
    assert compression.FP16Compressor.wire_dtype(tf.float32) == tf.float16
    assert compression.NoneCompressor.wire_dtype(tf.float32) == tf.float32
    assert compression.get(None) is compression.NoneCompressor
    assert compression.get("fp16") is compression.FP16Compressor
    assert compression.get(compression.Compression.fp16) is (
        compression.FP16Compressor
    )
    with pytest.raises(ValueError, match="compression='bf8'"):
        compression.get("bf8")


def test_strategy_takes_the_public_compression_classes():
    script = (
        "import keras_largebatch.distribute as d\n"
        "s = d.MultiWorkerMirroredStrategy(compression=d.Compression.fp16)\n"
        "print('CONFIG', s.get_config()['compression'])\n"
        "print('OPS', s.cross_device_ops._compressor.__name__)\n"
        "s = d.MultiWorkerMirroredStrategy(compression=d.Compression.none)\n"
        "print('NONE', s.get_config()['compression'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(l.split(" ", 1) for l in proc.stdout.splitlines() if " " in l)
    assert lines["CONFIG"] == "fp16"
    assert lines["OPS"] == "FP16Compressor"
    assert lines["NONE"] == "None"


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
    for k, reduced in enumerate(local_reduce[f"fp16_{op}_replica"]):
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


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_cross_replica_reductions_travel_in_full_precision_under_fp16(
    local_reduce, op
):
    # `strategy.reduce` and metrics: exact, as without compression (and
    # float32 on the wire, checked below).
    assert local_reduce[f"fp16_{op}"] == local_reduce[f"None_{op}"]
    assert local_reduce[f"None_{op}_replica"] == local_reduce[f"None_{op}"]


def test_buckets_follow_dtype_and_fp16_halves_float32_bytes(local_reduce):
    # Forward: f32[3,4], f16[5], f32[], f32[0,2], bf16[7,3]; int32 aside.
    # Reverse with 64-byte buckets: bf16 (42 B), f32 x3 (52 B), f16 (10 B).
    expected = [[1, 42, "flat"], [3, 52, "flat"], [1, 10, "flat"]]
    assert local_reduce["None_buckets_replica"] == expected
    # fp16: f32[0,2] and f32[3,4] as float16 (24 B); the scalar in a
    # float32 bucket of its own.
    assert local_reduce["fp16_buckets_replica"] == [
        [1, 42, "flat"], [2, 24, "flat"], [1, 4, "flat"], [1, 10, "flat"]
    ]


def test_strategy_reduce_sends_float32_under_fp16(local_reduce):
    # One value at a time, as `strategy.reduce`: f32[3,4] is 48 bytes.
    expected = [[1, 48, "flat"], [1, 10, "flat"], [1, 4, "flat"],
                [1, 42, "flat"]]
    assert local_reduce["None_buckets"] == expected
    assert local_reduce["fp16_buckets"] == expected
