"""Several processes: JAX's `keras.distribution` (`jax_cluster`), torch's
`torchrun` (`torch_cluster`), and the supervisor that runs each JAX
process's command in a child and names a lost one (`supervisor`)."""

from keras_largebatch.train.run.processes.jax_cluster import barrier  # noqa
from keras_largebatch.train.run.processes.jax_cluster import cluster  # noqa
from keras_largebatch.train.run.processes.jax_cluster import initialize  # noqa
from keras_largebatch.train.run.processes.jax_cluster import is_multi_process  # noqa
from keras_largebatch.train.run.processes.jax_cluster import join_error  # noqa
from keras_largebatch.train.run.processes.supervisor import SUPERVISED  # noqa
from keras_largebatch.train.run.processes.supervisor import lost_message  # noqa
from keras_largebatch.train.run.processes.supervisor import lost_processes  # noqa
from keras_largebatch.train.run.processes.supervisor import lost_worker_message  # noqa
from keras_largebatch.train.run.processes.supervisor import supervise  # noqa
from keras_largebatch.train.run.processes.torch_cluster import TORCHRUN  # noqa
from keras_largebatch.train.run.processes.torch_cluster import initialize_torch  # noqa
from keras_largebatch.train.run.processes.torch_cluster import torch_cluster  # noqa
