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

Where a run cannot save within an epoch (several processes or workers:
they would first have to agree on the step; `--compression=topk`, whose
residuals are saved at epoch ends), Ctrl-C stops it at the next batch's
end without saving and SIGTERM at once (a launcher such as torchrun
sends it to the processes left when one is lost, and they may wait in a
collective for it); it resumes from its last checkpoint. Before `handled`
(the imports, the command line) `cli.run`'s handler ends the process at
once with one line: nothing has been written then.
"""

import contextlib
import os
import signal
import sys
import threading

import keras

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received = []
# While `fit` trains: [whether the stop saves within the epoch]; the
# callback raises.
_in_fit = []


def exit_code(signum=None):
    """128 + the signal received first (`signum`, default the one this
    run received): 130 for SIGINT, 143 for SIGTERM."""
    if signum is None:
        signum = _received[0] if _received else signal.SIGINT
    return 128 + int(signum)


@contextlib.contextmanager
def handled(model_dir):
    """Within it, SIGINT and SIGTERM are recorded and raise
    `KeyboardInterrupt`: at once, or while `fit` trains at the next update
    boundary (`StopOnInterrupt`); a second one (or, in a run that cannot
    save within an epoch, SIGTERM) ends the process at once, with
    `message(model_dir)`. The handlers before it are put back after it."""
    def handler(signum, frame):
        _received.append(signum)
        if len(_received) > 1 or (
                _in_fit and not _in_fit[0] and signum == signal.SIGTERM):
            say_and_exit(message(model_dir, _received[0]), exit_code())
        if not _in_fit:
            raise KeyboardInterrupt

    _received.clear()
    _in_fit.clear()
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
    """Stops `fit` once SIGINT or SIGTERM came: at the next update
    boundary, saving `checkpoints` (a `StepCheckpoints`) there, or after
    the epoch's end where that boundary is its last step; without
    `checkpoints`, at the next batch's end. The last callback of `fit`:
    every other has seen the step, and the epoch's backup is written
    before it stops at an epoch's end."""

    def __init__(self, checkpoints=None):
        super().__init__()
        self.checkpoints = checkpoints

    def on_train_begin(self, logs=None):
        _in_fit.append(self.checkpoints is not None)
        if _received:
            self._stop()

    def on_train_batch_end(self, batch, logs=None):
        if not _received:
            return
        if self.checkpoints is None:
            self._stop()
        if self.checkpoints.at_update_boundary() and (
                self.checkpoints.save_now()):
            self._stop()

    def on_epoch_end(self, epoch, logs=None):
        if _received:
            self._stop()

    def on_train_end(self, logs=None):
        _in_fit.clear()

    def _stop(self):
        _in_fit.clear()
        raise KeyboardInterrupt


def message(model_dir, signum=None):
    """The one line of a run on `model_dir` stopped by `signum` (default
    the signal received): where the same command resumes, or that nothing
    can be resumed."""
    from keras_largebatch.train.checkpointing import restore

    if signum is None:
        signum = _received[0] if _received else signal.SIGINT
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
