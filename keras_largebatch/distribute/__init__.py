"""Distributed training (TensorFlow backend).

`MultiWorkerMirroredStrategy` is a drop-in `tf.distribute` strategy with
fused, hierarchical and hybrid all-reduce and optional fp16 transport,
under which Keras 3 `fit`, `evaluate` and `predict` run on many workers.
`native_ops_available()` says whether the C++ pack/unpack ops loaded.
The alpha-beta cost model is `keras_largebatch.distribute.cost_model`
(imported on demand).
"""

from keras_largebatch.distribute.all_reduce import FusedCollectiveAllReduce
from keras_largebatch.distribute.all_reduce import assign_buckets
from keras_largebatch.distribute.compression import Compression
from keras_largebatch.distribute.native import native_ops_available
from keras_largebatch.distribute.strategy import MultiWorkerMirroredStrategy

__all__ = [
    "Compression",
    "FusedCollectiveAllReduce",
    "MultiWorkerMirroredStrategy",
    "assign_buckets",
    "native_ops_available",
]
