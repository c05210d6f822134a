"""Distributed training (TensorFlow backend).

`MultiWorkerMirroredStrategy` is a drop-in `tf.distribute` strategy with
fused, hierarchical and hybrid all-reduce, optional fp16 transport and
top-k sparsification, under which Keras 3 `fit`, `evaluate` and `predict`
run on many workers.
`native_ops_available()` says whether the C++ pack/unpack ops loaded.
The alpha-beta cost model is `keras_largebatch.distribute.cost_model`.
"""

import importlib

# The strategy's defaults, importable without TensorFlow (the training
# command's flags use them).
from keras_largebatch.distribute.config import FUSION_THRESHOLD_BYTES
from keras_largebatch.distribute.config import HIERARCHICAL_THRESHOLD_BYTES

# Imported on first use, so that TensorFlow-free parts (`cost_model`,
# `buckets`, `localhost`, `config`) work without TensorFlow installed.
_PUBLIC = {
    "BucketRecord": "all_reduce",
    "Compression": "compression",
    "FusedCollectiveAllReduce": "all_reduce",
    "MultiWorkerMirroredStrategy": "strategy",
    "ReduceConfig": "config",
    "assign_buckets": "buckets",
    "native_ops_available": "native",
}


def __getattr__(name):
    if name in _PUBLIC:
        module = importlib.import_module(f"{__name__}.{_PUBLIC[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BucketRecord",
    "Compression",
    "FusedCollectiveAllReduce",
    "MultiWorkerMirroredStrategy",
    "ReduceConfig",
    "assign_buckets",
    "native_ops_available",
]
