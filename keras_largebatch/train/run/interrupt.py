"""Ctrl-C (SIGINT): the run stops with one line and exit code 130.

Python turns SIGINT into a `KeyboardInterrupt` wherever the main thread
is; where that is a finalizer (JAX's garbage-collection callback) or a
library that swallows it, the traceback is printed and the run goes on.
So within `handled` the handler records the signal, and while `fit`
trains it raises nothing: `StopOnInterrupt` (a callback of `fit`) raises
`KeyboardInterrupt` at the next batch's end, a place that swallows
nothing. Outside `fit`, and at a second Ctrl-C, the handler raises at
once. The driver catches it and prints one line (`message`): where the
run can resume from, or that nothing can be. Every checkpoint is written
atomically, so an interrupted save leaves the previous one whole.
"""

import contextlib
import signal
import threading

import keras

_received = []
_in_fit = []  # Non-empty while `fit` trains: the callback raises.


@contextlib.contextmanager
def handled():
    """Within it, SIGINT is recorded and raises `KeyboardInterrupt`: at
    once, or while `fit` trains at the next batch's end
    (`StopOnInterrupt`); the handler before it is put back after it."""
    def handler(signum, frame):
        _received.append(signum)
        if not _in_fit or len(_received) > 1:
            raise KeyboardInterrupt

    _received.clear()
    _in_fit.clear()
    if threading.current_thread() is not threading.main_thread():
        yield  # Signals reach the main thread only.
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        _in_fit.clear()
        signal.signal(signal.SIGINT, previous)


class StopOnInterrupt(keras.callbacks.Callback):
    """Raises `KeyboardInterrupt` at a batch's end once SIGINT came; while
    `fit` trains, the signal's handler leaves it to this."""

    def on_train_begin(self, logs=None):
        _in_fit.append(True)
        self.on_train_batch_end(None)

    def on_train_batch_end(self, batch, logs=None):
        if _received:
            _in_fit.clear()
            raise KeyboardInterrupt

    on_test_batch_end = on_train_batch_end
    on_epoch_end = on_train_batch_end

    def on_train_end(self, logs=None):
        _in_fit.clear()


def message(model_dir):
    """The one line of an interrupted run on `model_dir`: where the same
    command resumes, or that nothing can be resumed."""
    from keras_largebatch.train.checkpointing import restore

    try:
        start, _ = restore.choose(model_dir)
    except (ValueError, OSError):
        start = None
    if start is None:
        return ("interrupted (Ctrl-C) before the first checkpoint: nothing "
                "can be resumed; running the same command starts the run "
                "over")
    return (f"interrupted (Ctrl-C): run the same command to resume from "
            f"{start.describe(model_dir)} in {model_dir}")
