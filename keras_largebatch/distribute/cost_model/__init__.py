"""An alpha-beta model of fused ring, hierarchical, hybrid and top-k
sparsified all-reduce.

`alpha_beta` holds the formulas (Jia et al. 2018, arXiv:1807.11205),
`gradients` the gradient sets of ResNet-50, AlexNet-BN or a saved model,
`fit` the least-squares fit of alpha and beta to measured timings (and a
2-worker TensorFlow measurement on localhost), `cli` the command:

```
python -m keras_largebatch.distribute.cost_model --model=resnet50 \
    --gpus=8,64,512,1024,2048 --gpus_per_node=8
```

Nothing here imports TensorFlow; only a saved-model path needs Keras.
"""

from keras_largebatch.distribute.cost_model.alpha_beta import MiB
from keras_largebatch.distribute.cost_model.alpha_beta import Network
from keras_largebatch.distribute.cost_model.alpha_beta import compare
from keras_largebatch.distribute.cost_model.alpha_beta import crossover_bytes
from keras_largebatch.distribute.cost_model.alpha_beta import (
    flat_allreduce_time,
)
from keras_largebatch.distribute.cost_model.alpha_beta import fuse
from keras_largebatch.distribute.cost_model.alpha_beta import (
    hierarchical_allreduce_time,
)
from keras_largebatch.distribute.cost_model.alpha_beta import (
    hybrid_allreduce_time,
)
from keras_largebatch.distribute.cost_model.alpha_beta import (
    inter_alpha_for_speedup,
)
from keras_largebatch.distribute.cost_model.alpha_beta import (
    ring_allreduce_time,
)
from keras_largebatch.distribute.cost_model.alpha_beta import (
    sparse_allreduce_time,
)
from keras_largebatch.distribute.cost_model.alpha_beta import (
    sparse_crossover_density,
)
from keras_largebatch.distribute.cost_model.alpha_beta import step_time
from keras_largebatch.distribute.cost_model.cli import define_flags
from keras_largebatch.distribute.cost_model.cli import format_table
from keras_largebatch.distribute.cost_model.cli import run
from keras_largebatch.distribute.cost_model.fit import fit_alpha_beta
from keras_largebatch.distribute.cost_model.fit import load_timings
from keras_largebatch.distribute.cost_model.fit import measure_localhost
from keras_largebatch.distribute.cost_model.gradients import alexnet_bn_shapes
from keras_largebatch.distribute.cost_model.gradients import gradient_bytes
from keras_largebatch.distribute.cost_model.gradients import resnet50_shapes
from keras_largebatch.distribute.cost_model.gradients import (
    saved_model_shapes,
)
