"""`ReduceConfig`: the strategy's reduce settings, their defaults and checks,
defined once."""

import dataclasses
import inspect
import types

import keras
import pytest

from keras_largebatch import distribute
from keras_largebatch.distribute.config import ReduceConfig

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="keras_largebatch.distribute needs the TensorFlow backend",
)

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    from keras_largebatch.distribute import MultiWorkerMirroredStrategy
    from keras_largebatch.distribute.all_reduce import FusedCollectiveAllReduce


def test_strategy_defaults_are_the_configs():
    parameters = inspect.signature(
        MultiWorkerMirroredStrategy.__init__
    ).parameters
    defaults = {
        name: p.default for name, p in parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert defaults == ReduceConfig().get_config()
    assert distribute.FUSION_THRESHOLD_BYTES == 8 * 2**20
    assert distribute.HIERARCHICAL_THRESHOLD_BYTES == 4 * 2**20


def test_compression_is_kept_as_its_serialized_name_and_selects_topk():
    assert ReduceConfig(compression="none").compression is None
    assert ReduceConfig(
        compression=distribute.Compression.fp16
    ).compression == "fp16"
    assert ReduceConfig(compression=distribute.Compression.topk).topk
    assert ReduceConfig(compression="topk").topk
    assert not ReduceConfig(compression="fp16").topk


def test_get_config_leaves_out_what_is_not_a_strategy_argument():
    config = ReduceConfig(topk_exact_max_elements=0, topk_error_feedback=0)
    assert "topk_exact_max_elements" not in config.get_config()
    assert config.get_config()["topk_error_feedback"] is False


def test_bad_exact_max_elements_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="topk_exact_max_elements=-1"):
        ReduceConfig(topk_exact_max_elements=-1)


def test_cross_device_ops_take_their_settings_as_one_config():
    options = tf.distribute.experimental.CommunicationOptions()
    with pytest.raises(TypeError, match="fusion_threshold_bytes"):
        FusedCollectiveAllReduce(
            ["/cpu:0"], 1, options, fusion_threshold_bytes=64
        )
    with pytest.raises(ValueError, match="config=64"):
        FusedCollectiveAllReduce(["/cpu:0"], 1, options, config=64)
    ops = FusedCollectiveAllReduce(["/cpu:0"], 1, options)
    assert ops.config == ReduceConfig()
    with pytest.raises(ValueError, match="config=\\{"):
        ops.config = {"compression": "fp16"}


def test_get_config_reports_the_settings_the_cross_device_ops_use():
    # A strategy's own cross-device ops (a real strategy would start
    # TensorFlow's collectives in this process).
    options = tf.distribute.experimental.CommunicationOptions()
    ops = FusedCollectiveAllReduce(
        ["/cpu:0"], 1, options,
        config=ReduceConfig(fusion_threshold_bytes=64),
    )
    strategy = types.SimpleNamespace(cross_device_ops=ops)
    get_config = MultiWorkerMirroredStrategy.get_config
    assert get_config(strategy)["fusion_threshold_bytes"] == 64
    ops.config = dataclasses.replace(ops.config, compression="fp16",
                                     fusion_threshold_bytes=128)
    assert get_config(strategy) == ops.config.get_config()
    assert get_config(strategy)["compression"] == "fp16"
    assert get_config(strategy)["fusion_threshold_bytes"] == 128
    assert distribute.ReduceConfig is ReduceConfig
