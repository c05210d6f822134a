"""Where the processes of a job agree on the step a signal stops them at.

A signal (`run.interrupt`) may reach one process of a job, or all of them
at different moments; they must all save at the same update and stop
there, or the one that stops first leaves the others waiting in a
collective. `StopOnInterrupt` asks `stop_at(n, received)` at every update
boundary and every epoch's end of `fit`, n counting those calls (the same
on every process), with the signals this process has received. It
returns None to go on, or the signal that stops the job, on every process
at the same call:

    Alone              one process: its own signal, at the next call
    JaxPreemption      JAX processes: the coordination service's preemption
                       sync manager (`multihost_utils.
                       reached_preemption_sync_point`, what Orbax uses)
    TorchFlags         torch processes: the flags summed by an all-reduce on
                       a gloo group, every call
    TensorFlowFlags    TensorFlow workers: the flags summed through the
                       strategy, every call

`barrier()` returns once every process has called it (after the chief's
save, before any reads it), and `close()` ends the job's runtime cleanly
before the process exits.
"""

import datetime
import signal

import keras

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def for_devices(devices):
    """The agreement of the job `devices` (`placement.Devices`) runs."""
    backend = keras.backend.backend()
    if devices.workers > 1:
        return TensorFlowFlags(devices.strategy)
    if devices.process_count > 1:
        return JaxPreemption() if backend == "jax" else TorchFlags()
    return Alone()


class Alone:
    """One process: it stops at the next call after its own signal. Asked
    only once a signal came (`polls` False)."""

    polls = False

    def stop_at(self, step, received):
        return received[0] if received else None

    def barrier(self):
        pass

    def close(self):
        pass


def _flags(received):
    """[SIGINT, SIGTERM]: 1 for the signal this process received first."""
    return [int(bool(received) and received[0] == s) for s in SIGNALS]


def _signal_of(total, received):
    """The signal that stops this process: its own, else the job's (SIGTERM
    where the others received both); None where `total` (the flags summed
    over the job) holds none."""
    if received:
        return received[0]
    if total[1] > 0:
        return signal.SIGTERM
    return signal.SIGINT if total[0] > 0 else None


class JaxPreemption:
    """JAX processes (`jax.distributed`): the preemption sync manager.

    The coordination service's preemption sync manager takes a notice
    (the key `NOTICE`, a death time), gathers each process's last step
    id, and makes `reached_preemption_sync_point(step)` true on every
    process at the same step, the fastest one's next; until a notice
    it is a local check. JAX's own notifier writes the notice on SIGTERM
    from a C handler of its own, which `jax_cluster.initialize` replaces
    by Python's again (a second signal must end the process at once, and
    Ctrl-C must stop the job as SIGTERM does), so a process writes the
    notice itself once it has a signal, with the signal's number under
    `SIGNAL` for the processes that received none.

    Private API (jaxlib 0.10.2, xla/tsl's preemption_sync_manager.cc):
    `jax._src.distributed.global_state.client`, the coordination service's
    key-value store (JAX exposes no other), and the notice's key and
    RFC 3339 time; the two-process SIGTERM test pins them.
    """

    polls = True
    NOTICE = "RECEIVED_PREEMPTION_NOTICE"
    SIGNAL = "keras_largebatch/stop_signal"

    def __init__(self):
        from jax._src import distributed

        self._client = distributed.global_state.client
        self._notified = False

    def _notify(self, signum):
        self._notified = True
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        for key, value in ((self.SIGNAL, str(int(signum))),
                           (self.NOTICE, now)):
            try:
                self._client.key_value_set(key, value)
            except Exception:  # Another process's was first: it stands.
                pass

    def stop_at(self, step, received):
        from jax.experimental import multihost_utils

        if received and not self._notified:
            self._notify(received[0])
        if not multihost_utils.reached_preemption_sync_point(step):
            return None
        if received:
            return received[0]
        try:
            return signal.Signals(int(self._client.key_value_try_get(
                self.SIGNAL)))
        except Exception:  # JAX's notifier saw a SIGTERM before ours.
            return signal.SIGTERM

    def barrier(self):
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("keras_largebatch stop")

    def close(self):
        """Leaves the job as its end does (`jax.distributed.shutdown`, a
        barrier of all processes): a process that exits while the others
        are still connected makes the runtime abort them."""
        import jax

        jax.distributed.shutdown()


class TorchFlags:
    """torch processes (`torch.distributed`): each call all-reduces the
    flags of the signal each process received first, on the default group
    where it is gloo, else on a gloo group made for them (CPU tensors, no
    device sync)."""

    polls = True

    def __init__(self):
        import torch.distributed as dist

        self._group = (None if dist.get_backend() == "gloo"
                       else dist.new_group(backend="gloo"))

    def stop_at(self, step, received):
        import torch
        import torch.distributed as dist

        flags = torch.tensor(_flags(received), dtype=torch.int32)
        dist.all_reduce(flags, group=self._group)
        return _signal_of(flags.tolist(), received)

    def barrier(self):
        import torch.distributed as dist

        dist.barrier(group=self._group)

    def close(self):
        pass


class TensorFlowFlags:
    """TensorFlow workers (`MultiWorkerMirroredStrategy`): each call sums
    the flags of the signal each worker received first, an all-reduce
    across the replicas of `strategy` in a `tf.function` traced once."""

    polls = True

    def __init__(self, strategy):
        import tensorflow as tf

        def replica(flags):
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, flags)

        @tf.function
        def total(flags):
            summed = strategy.run(replica, args=(flags,))
            return strategy.experimental_local_results(summed)[0]

        self._total = total

    def stop_at(self, step, received):
        import tensorflow as tf

        total = self._total(tf.constant(_flags(received), tf.float32))
        return _signal_of(total.numpy().tolist(), received)

    def barrier(self):
        self.stop_at(0, [])  # An all-reduce all workers join.

    def close(self):
        pass
