"""Several torch processes: `torchrun`'s.

On torch (Keras >= 3.16, whose `fit` wraps the model in
`DistributedDataParallel` once `torch.distributed` is initialized),
`initialize_torch` starts the default process group from `torchrun`'s
variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`): NCCL on GPUs (this process on GPU `LOCAL_RANK`), gloo on
a CPU, with `--collective_timeout_seconds` as the group's timeout. Rank 0
is the chief. `torchrun` supervises: a failed process makes it end the
"""

import os

from keras_largebatch._shared import require
from keras_largebatch.train.run.processes import int_variables


TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def cluster():
    """(rank, world size, local rank) from `torchrun`'s variables; None
    when `WORLD_SIZE` is unset. Raises `ValueError` naming a bad one."""
    raw = {name: os.environ.get(name) for name in TORCHRUN}
    if raw["WORLD_SIZE"] is None:
        return None
    numbers = int_variables(("RANK", "WORLD_SIZE", "LOCAL_RANK",
                             "MASTER_PORT"), "torchrun sets it")
    count, rank = numbers["WORLD_SIZE"], numbers["RANK"]
    require(count >= 1, "WORLD_SIZE", count, "an int >= 1")
    require(0 <= rank < count, "RANK", rank,
            f"in [0, {count}) (WORLD_SIZE={count})")
    require(bool(raw["MASTER_ADDR"]), "MASTER_ADDR", raw["MASTER_ADDR"] or "",
            "rank 0's host (torchrun sets it)")
    return rank, count, numbers["LOCAL_RANK"]


def initialize_torch(gpu, timeout_seconds=0):
    """Joins the torch process group of `cluster()` (NCCL where `gpu`,
    else gloo); returns (rank, world size). A world of one process starts
    no group."""
    rank, count, local_rank = cluster()
    if count == 1:
        return 0, 1
    import datetime

    import torch

    if gpu:
        torch.cuda.set_device(local_rank)  # Keras' "cuda" is this GPU.
    timeout = (datetime.timedelta(seconds=timeout_seconds)
               if timeout_seconds else None)
    try:
        torch.distributed.init_process_group(
            "nccl" if gpu else "gloo", timeout=timeout)
    except Exception as e:  # The store's error types are internal.
        raise ValueError(
            f"Process {rank} of {count} could not join the torch process "
            f"group at {os.environ['MASTER_ADDR']}:"
            f"{os.environ['MASTER_PORT']}: start every process, with "
            f"torchrun ({type(e).__name__}: {str(e)[:200]}). Received: "
            f"RANK={rank}, WORLD_SIZE={count}") from e
    return torch.distributed.get_rank(), torch.distributed.get_world_size()
