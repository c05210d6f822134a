"""Several processes: JAX's `keras.distribution` (`jax_cluster`), torch's
`torchrun` (`torch_cluster`), the supervisor that runs each JAX
process's command in a child and names a lost one (`supervisor`), and
where a job's processes agree on the step a signal stops them at
(`agreement`)."""

import contextlib
import os
import signal
import threading


def int_variables(names, why):
    """{name: int} of the environment variables `names`; a `ValueError`
    naming the first that is unset or not an int, with `why` (when or by
    whom it is set)."""
    found = {}
    for name in names:
        raw = os.environ.get(name)
        try:
            found[name] = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"`{name}` must be an int ({why}). "
                             f"Received: {name}={raw!r}") from None
    return found


@contextlib.contextmanager
def python_sigterm():
    """Puts Python's SIGTERM handler back after the block: JAX's and
    TensorFlow's coordination services start a preemption notifier that
    takes SIGTERM over with a C handler of their own (the job's processes
    agree on the step through `agreement` instead)."""
    ours = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(ours) and (threading.current_thread()
                               is threading.main_thread()):
            signal.signal(signal.SIGTERM, ours)
