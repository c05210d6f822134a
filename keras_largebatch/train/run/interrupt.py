"""Ctrl-C (SIGINT) and SIGTERM: the run saves where it is, writes its
records and stops with one line saying where the same command resumes.

    exit code 130   after SIGINT (Ctrl-C)
    exit code 143   after SIGTERM (a scheduler's preemption)

128 + the signal, as a shell and a scheduler report a process the signal
ended. Python turns SIGINT into a `KeyboardInterrupt` wherever the main
thread is; where that is a finalizer (JAX's garbage-collection callback)
or a library that swallows it, the traceback is printed and the run goes
on. So within `handled` the handler records the signal, and while `fit`
trains it raises nothing: `StopOnInterrupt`, the last callback of `fit`,
stops the run at the next update boundary (a step: all micro-batches of
the update applied). There it saves a checkpoint within the epoch
(`StepCheckpoints.save_now`, what `--checkpoint_every_steps` writes), so
that at most the step under way is lost, and raises `KeyboardInterrupt`,
at a place that swallows nothing. At an epoch's last step the epoch ends
first (its validation, its records, its backup) and the run stops after
it. Outside `fit` the handler raises at once; a second signal ends the
process at once, with the same line. The driver catches the
`KeyboardInterrupt` and prints the line (`message`). Every checkpoint is
written atomically, so an interrupted save leaves the previous one whole.

A job of several processes (JAX processes, torch's under `torchrun`,
TensorFlow workers) stops the same way once a signal reaches any of
them: its processes first agree on the update boundary
(`processes.agreement`: JAX's preemption sync manager; a flag all-reduced
at every boundary on torch and TensorFlow), all save there, wait for each
other, and each prints the line and exits with the code of its own
signal, or of the one the job received. A signal outside `fit` ends only
the process it reaches (at once, nothing agreed), and the others then
stop as they do when a process is lost; where the agreement fails (a
collective with a lost process), a process with a signal stops at once,
without saving.

Under `--compression=topk` each worker's checkpoint within the epoch also
holds its error-feedback residuals, all written before the chief's
pointer names the checkpoint. Before `handled` (the imports, the command line) `cli.run`'s handler ends
the process at once with one line: nothing has been written then.
"""

import contextlib
import os
import signal
import sys
import threading

import keras

from keras_largebatch.train.run.processes import agreement as agreements

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received = []
# While `fit` trains: [whether the stop saves within the epoch]; the
# callback raises.
_in_fit = []
# Once the job agreed to stop: [the signal that stops it, its agreement].
_stopped = []


def _signal():
    """The signal this process received first, else the job's, else
    SIGINT."""
    if _received:
        return _received[0]
    return _stopped[0] if _stopped else signal.SIGINT


def exit_code(signum=None):
    """128 + the signal received first (`signum`, default the one this
    run received, or the one its job stopped for): 130 for SIGINT, 143
    for SIGTERM."""
    return 128 + int(_signal() if signum is None else signum)


@contextlib.contextmanager
def handled(model_dir):
    """Within it, SIGINT and SIGTERM are recorded and raise
    `KeyboardInterrupt`: at once, or while `fit` trains at the next update
    boundary the job agrees on (`StopOnInterrupt`); a second one (or, in a
    run that cannot save within an epoch, SIGTERM) ends the process at
    once, with `message(model_dir)`. The handlers before it are put back
    after it, and a job that agreed to stop is left (`close`)."""
    def handler(signum, frame):
        _received.append(signum)
        if len(_received) > 1 or (
                _in_fit and not _in_fit[0] and signum == signal.SIGTERM):
            say_and_exit(message(model_dir, _received[0]), exit_code())
        if not _in_fit:
            raise KeyboardInterrupt

    _received.clear()
    _in_fit.clear()
    _stopped.clear()
    if threading.current_thread() is not threading.main_thread():
        yield  # Signals reach the main thread only.
        return
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        _in_fit.clear()
        for s, h in previous.items():
            signal.signal(s, h)


def close():
    """After the line of a job that agreed to stop: leaves the job as its
    end does (`agreement.close()`), so that no process's exit aborts
    another's; the process exits next, whatever that raises."""
    if _stopped:
        with contextlib.suppress(Exception):
            _stopped[1].close()


def say_and_exit(line, code):
    """Writes `line` to stderr and ends the process with `code` at once,
    from a signal's handler: a plain write, for the main thread may be
    inside a `print` (whose buffer would refuse a second)."""
    from keras_largebatch.train import PROG

    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, f"{PROG}: {line}\n".encode())
    os._exit(code)


class StopOnInterrupt(keras.callbacks.Callback):
    """Stops `fit` once SIGINT or SIGTERM came: at the update boundary
    `agreement` (a `processes.agreement` object, default `Alone`) agrees
    on, saving `checkpoints` (a `StepCheckpoints`) there and waiting for
    the job's other processes, or after the epoch's end where that
    boundary is its last step; without `checkpoints`, at the next batch's
    end. The last callback of `fit`: every other has seen the step, and
    the epoch's backup is written before it stops at an epoch's end.

    `agreement.stop_at` is asked at every update boundary and epoch end
    where the agreement `polls` (several processes), else only once this
    process has a signal."""

    def __init__(self, checkpoints=None, agreement=None):
        super().__init__()
        self.checkpoints = checkpoints
        self.agreement = agreement or agreements.Alone()
        self._calls = 0
        self._agreed = None

    def on_train_begin(self, logs=None):
        _in_fit.append(self.checkpoints is not None)
        self._calls, self._agreed = 0, None
        if _received and not self.agreement.polls:
            self._stop()

    def on_train_batch_end(self, batch, logs=None):
        if self.checkpoints is None:
            if _received:
                self._stop()
            return
        if not (_received or self.agreement.polls):
            return
        if self.checkpoints.at_update_boundary() and self._agree():
            if self.checkpoints.save_now():
                self._stop()
            # Else the epoch's last step: it stops after the epoch's end.

    def on_epoch_end(self, epoch, logs=None):
        if self.checkpoints is None:
            if _received:
                self._stop()
            return
        if self._agreed is not None or (
                (_received or self.agreement.polls) and self._agree()):
            self._stop()

    def on_train_end(self, logs=None):
        _in_fit.clear()

    def _agree(self):
        """Whether the job stops at this call (the same on every process).
        Where the agreement fails (a collective with a lost process: a
        launcher such as torchrun signals the processes left), a process
        with a signal stops at once, without saving."""
        self._calls += 1
        try:
            self._agreed = self.agreement.stop_at(self._calls, _received)
        except Exception as e:
            if not _received:
                raise
            _in_fit.clear()
            raise KeyboardInterrupt from e
        return self._agreed is not None

    def _stop(self):
        _in_fit.clear()
        if self._agreed is not None:
            _stopped[:] = [self._agreed, self.agreement]
            self.agreement.barrier()  # The chief's save is on disk.
        raise KeyboardInterrupt


def message(model_dir, signum=None):
    """The one line of a run on `model_dir` stopped by `signum` (default
    the signal received): where the same command resumes, or that nothing
    can be resumed."""
    from keras_largebatch.train.checkpointing import restore

    if signum is None:
        signum = _signal()
    said = ("interrupted (Ctrl-C)" if signum == signal.SIGINT
            else f"stopped by {signal.Signals(signum).name}")
    try:
        start, _ = restore.choose(model_dir)
    except (ValueError, OSError):
        start = None
    if start is None:
        return (f"{said} before the first checkpoint: nothing can be "
                f"resumed; running the same command starts the run over")
    return (f"{said}: run the same command to resume from "
            f"{start.describe(model_dir)} in {model_dir}")
