"""Where a run computes: `Devices`, `place`, which builds them, and
`barrier`, where a job's processes wait for each other.

`place(placement)` reads the flags of `RunConfig.placement`, first
`--distribution`:

    none            one process, Keras' default device
    multi_worker    keras_largebatch.distribute's MultiWorkerMirroredStrategy
                    over TF_CONFIG's workers (TensorFlow backend)
    data_parallel   keras.distribution.DataParallel over the local devices
                    of one or several JAX processes (JAX backend); torch's
                    DistributedDataParallel over the processes `torchrun`
                    started, one device each (torch backend, Keras >= 3.16)

It raises `ValueError` for a backend (or a Keras) that cannot run the
distribution, a `TF_CONFIG` that is not JSON, or a torch run of
`data_parallel` outside `torchrun`.
"""

import dataclasses
import json
import os

import keras

from keras_largebatch import distribute
from keras_largebatch.train.run import processes
from keras_largebatch.train.run.processes import jax_cluster
from keras_largebatch.train.run.processes import torch_cluster

@dataclasses.dataclass(frozen=True)
class Devices:
    """Where the run computes (`--distribution`).

    Attributes:
        strategy: the `MultiWorkerMirroredStrategy`, or None.
        replicas: model replicas over all workers or devices.
        chief: whether this process writes the run's outputs.
        task: this worker's (TF_CONFIG) or process's (JAX, torch) index.
        workers: TF_CONFIG's workers (1 without one).
        process_index, process_count: this process among the job's (JAX
            processes, or torch's under torchrun: its rank, world size).
    """

    strategy: object = None
    replicas: int = 1
    chief: bool = True
    task: int = 0
    workers: int = 1
    process_index: int = 0
    process_count: int = 1



# The first Keras whose torch `fit` wraps the model in torch's
# DistributedDataParallel (keras-team/keras#23316).
TORCH_DDP_KERAS = (3, 16)


def place(placement):
    """The `Devices` of `placement` (`RunConfig.placement`); the
    multi-worker strategy first, before any other TensorFlow op."""
    if placement.distribution == "multi_worker":
        _require_backend("tensorflow", "`distribution=multi_worker` needs "
                         "the TensorFlow backend (KERAS_BACKEND=tensorflow)")
        cluster = _tf_config()
        strategy = _multi_worker_strategy(placement)
        task = cluster.get("task", {})
        index = task.get("index", 0)
        chief = task.get("type", "worker") == "chief" or (
            "chief" not in cluster.get("cluster", {}) and index == 0)
        workers = len(cluster.get("cluster", {}).get("worker", [])) or 1
        return Devices(strategy, strategy.num_replicas_in_sync, chief, index,
                       workers)
    if (placement.distribution == "data_parallel"
            and keras.backend.backend() == "torch"):
        return _torch_processes(placement)
    strategy, replicas, chief, task = _distribution(placement)
    if placement.distribution != "data_parallel":
        return Devices(strategy, replicas, chief, task)
    import jax  # Here only: torch runs import no JAX.

    return Devices(strategy, replicas, chief, task, 1, jax.process_index(),
                   jax.process_count())


def _distribution(placement):
    """`none` or `data_parallel`: (None, replicas, is_chief, process
    index)."""
    if placement.distribution == "none":
        return None, 1, True, 0
    _require_backend("jax", "`distribution=data_parallel` needs the JAX "
                     "backend (keras.distribution) or torch (torchrun)")
    index, _ = jax_cluster.initialize(placement.collective_timeout_seconds)
    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(
        devices=devices, auto_shard_dataset=False))
    return None, len(devices), index == 0, index


def _torch_processes(placement):
    """`data_parallel` on torch: the `Devices` of this `torchrun` process,
    one device per process, rank 0 the chief; Keras' `fit` wraps the model
    in `DistributedDataParallel` (Keras >= 3.16)."""
    installed = keras.__version__
    if tuple(int(p) for p in installed.split(".")[:2]) < TORCH_DDP_KERAS:
        raise ValueError(
            "`distribution=data_parallel` on the torch backend needs Keras "
            ">= 3.16 (its `fit` wraps the model in DistributedDataParallel); "
            f"Keras {installed} is installed: use the JAX backend, or "
            f"Keras >= 3.16. Received: distribution=data_parallel, "
            f"backend=torch, keras={installed}")
    if torch_cluster.cluster() is None:
        raise ValueError(
            "`distribution=data_parallel` on the torch backend runs under "
            "torchrun (`torchrun --nproc_per_node=N -m "
            "keras_largebatch.train.cli ...`), which sets RANK and "
            "WORLD_SIZE; use --distribution=none for one process. "
            "Received: WORLD_SIZE=None")
    gpu = keras.distribution.list_devices()[0].startswith("gpu")
    rank, count = torch_cluster.initialize_torch(
        gpu, placement.collective_timeout_seconds)
    return Devices(None, count, rank == 0, rank, 1, rank, count)


def _require_backend(name, what):
    """Raises `ValueError` (`what`, then the backend) unless the Keras
    backend is `name`."""
    backend = keras.backend.backend()
    if backend != name:
        raise ValueError(f"{what}. Received: backend={backend}")


def _tf_config():
    """`TF_CONFIG` parsed ({} when unset); `ValueError` unless JSON."""
    raw = os.environ.get("TF_CONFIG")
    try:
        return json.loads(raw) if raw is not None else {}
    except json.JSONDecodeError:
        raise ValueError(
            "The TF_CONFIG environment variable must be JSON (or unset for "
            f"one worker). Received: TF_CONFIG={raw!r}") from None


def _multi_worker_strategy(placement):
    """The `MultiWorkerMirroredStrategy` of `placement`.

    `place` creates it first, after parsing and checking the flags and
    before any other TensorFlow op: TensorFlow configures collectives when
    its runtime starts, and the strategy waits there for every worker in
    `TF_CONFIG`.
    """
    # Here only: TensorFlow is optional, and JAX and torch runs import none.
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=placement.collective_timeout_seconds or None)
    # Its coordination service's preemption notifier takes SIGTERM over.
    with processes.python_sigterm():
        return distribute.MultiWorkerMirroredStrategy(
            communication_options=options,
            fusion_threshold_bytes=placement.fusion_threshold_bytes,
            hierarchical_threshold_bytes=(
                placement.hierarchical_threshold_bytes),
            compression=placement.compression,
            workers_per_node=placement.workers_per_node or None,
            topk_density=placement.topk_density,
        )


def barrier(backend, process_count):
    """Returns once every process of the job has called it (at once alone):
    after each has read `model_dir`, before the chief writes there, so
    that no process takes the chief's new `run_config.json` (or a raise of
    `--epochs` it records) for a run to resume."""
    if process_count == 1:
        return
    if backend == "torch":
        import torch

        torch.distributed.barrier()
    else:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("keras_largebatch model_dir")
