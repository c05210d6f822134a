"""The reduce settings of `MultiWorkerMirroredStrategy`, defined once.

`ReduceConfig` holds them, with their defaults, and checks them when it is
made. The strategy builds one from its keyword arguments and hands it to
its cross-device ops, which read every setting from it (`config`, also
assignable); the strategy's `get_config()` is the ops' config's. Importing this
module needs no TensorFlow (the training command's flags read the
defaults); checking `compression` imports it.
"""

import dataclasses
from typing import Any
from typing import Optional

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number

FUSION_THRESHOLD_BYTES = 8 * 2**20
HIERARCHICAL_THRESHOLD_BYTES = 4 * 2**20


@dataclasses.dataclass(frozen=True)
class ReduceConfig:
    """How gradients are reduced (see `MultiWorkerMirroredStrategy`).

    Args:
        fusion_threshold_bytes: Int >= 0, bucket capacity; `0` reduces each
            tensor alone. Defaults to 8 MiB.
        hierarchical_threshold_bytes: Int >= 0; buckets smaller than this
            (wire bytes) go hierarchical on multi-node jobs; `0`: never.
            Defaults to 4 MiB.
        compression: `None`, `"none"`, `"fp16"`, `"topk"` or a
            `compression.Compressor` class; kept as `compression.serialize`
            gives it (`None`, a built-in's name, or the class).
        workers_per_node: Int >= 1 or `None` (tasks sharing a host).
        topk_density: Float in (0, 1], the fraction of each bucket sent
            under `"topk"`. Defaults to 0.01.
        topk_error_feedback: Bool, under `"topk"`: keep what was not sent
            as a residual. Defaults to True.
        topk_exact_max_elements: Int >= 0; top-k buckets up to this many
            values use the exact `tf.math.top_k`, larger ones MSTopK. Not a
            strategy argument, so not in `get_config()`. Defaults to 65,536.
    """

    fusion_threshold_bytes: int = FUSION_THRESHOLD_BYTES
    hierarchical_threshold_bytes: int = HIERARCHICAL_THRESHOLD_BYTES
    compression: Any = None
    workers_per_node: Optional[int] = None
    topk_density: float = 0.01
    topk_error_feedback: bool = True
    topk_exact_max_elements: int = dataclasses.field(
        default=2**16, metadata={"strategy_argument": False}
    )

    def __post_init__(self):
        from keras_largebatch.distribute import compression as compression_lib

        check_int("fusion_threshold_bytes", self.fusion_threshold_bytes, 0)
        check_int(
            "hierarchical_threshold_bytes", self.hierarchical_threshold_bytes,
            0,
        )
        if self.workers_per_node is not None:
            check_int("workers_per_node", self.workers_per_node, 1)
        compression = compression_lib.serialize(self.compression)
        check_number("topk_density", self.topk_density, lambda d: 0 < d <= 1,
                     "in (0, 1]")
        check_int("topk_exact_max_elements", self.topk_exact_max_elements, 0)
        # Frozen: the two normalized fields are set as dataclasses do.
        object.__setattr__(self, "compression", compression)
        object.__setattr__(
            self, "topk_error_feedback", bool(self.topk_error_feedback)
        )

    @property
    def topk(self):
        """Whether gradient buckets are reduced by the top-k exchange."""
        return self.compression == "topk"

    def get_config(self):
        """The strategy's keyword arguments, as its `get_config()` gives
        them."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata.get("strategy_argument", True)
        }
