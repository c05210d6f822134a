"""The process pool of every study and of the GPU check: runs the specs
(`runspec.py`) not yet in a record, a few processes at a time within a time
budget, and writes each finished run into the record with its machine
stamp (`provenance.stamp`).

A task (a spec with a `module`) does not resume, so one that fails or runs
past its `limit_seconds` is recorded under `failed` with its error, and no
call starts it again; none starts once one is expected to end after the
budget (taking as long as the longest of its part and backend in this
call); and one that exits `NO_GPU` stops the call (`NoGPU`). A spec whose
`run_backend` is not installed is said once a call and left for a call
where it is. A run whose record is short of its spec
(`runspec.incomplete`) is not done: it runs again from a fresh folder (its
old one set aside, never deleted), and its record replaces the short one,
which the record keeps under `incomplete`. A runner stopped by SIGTERM or
SIGINT stops its runs first (SIGTERM: each saves at its next step) and
exits 143 or 130; a rerun resumes them.
"""

import collections
import datetime
import importlib.util
import os
import signal
import subprocess
import threading
import time

import bench
from bench.core import provenance
from bench.core import records
from bench.core import runspec

NO_GPU = 3  # A task's exit status: no GPU where it needs one.
POLL = 1.0  # Seconds between looks at the running processes.
# Seconds a stopped process has after SIGTERM before SIGKILL: the command
# saves a checkpoint at its next step and exits 143 (docs/training.md).
GRACE = 30


class NoGPU(SystemExit):
    """A task found no GPU where it needs one: the call stops (a GPU
    machine that sees none would spend its time measuring nothing)."""


class Stopped(SystemExit):
    """The runner got SIGTERM or SIGINT: its runs are stopped, then it
    exits 143 or 130 (no traceback)."""


SIGNALS = (signal.SIGINT, signal.SIGTERM)


# A signal that comes while a run's process is being started (`starting`,
# `_start_held`) waits until the runner holds that process, so that it is
# stopped too.
_deferred = {"starting": False, "signal": None}


def _stopped(signum, frame):
    if _deferred["starting"]:
        _deferred["signal"] = signum
        return
    raise Stopped(128 + signum)


def _start_held(spec, work_dir, data_dir, env, busy, clock):
    """`start`, its process put in `busy` before a signal that came in
    between takes effect (raised here, after)."""
    _deferred.update(starting=True, signal=None)
    try:
        busy[start(spec, work_dir, data_dir, env)] = (spec, clock)
    finally:
        _deferred["starting"] = False
    if _deferred["signal"] is not None:
        raise Stopped(128 + _deferred["signal"])


def installed(backend):
    """Whether the package of `backend` (a Keras backend) is here."""
    return importlib.util.find_spec(backend) is not None


def start(spec, work_dir, data_dir="", env=None):
    """The process of `spec`, its stderr (and a task's stdout) in the run's
    folder; a task in a process group of its own, stopped whole."""
    directory = runspec.model_dir(spec, work_dir)
    os.makedirs(directory, exist_ok=True)
    own = dict(os.environ if env is None else env,
               **({"KERAS_BACKEND": spec["run_backend"]}
                  if "run_backend" in spec else {}))
    task = "module" in spec
    if task or "program" in spec:
        own = bench.environ(own)
    with open(os.path.join(directory, "stderr.txt"), "w") as err, \
            open(os.path.join(directory, "stdout.txt") if task
                 else os.devnull, "w") as out:
        return subprocess.Popen(runspec.process_command(spec, work_dir, data_dir),
                                stdout=out, stderr=err, env=own,
                                start_new_session=task)


def stop(proc, group):
    """Stops a process (`group`: with its process group): `stop_all`."""
    stop_all([(proc, group)])


def stop_all(procs):
    """Stops processes together, each [(process, group)] (`group`: with its
    process group): one SIGTERM each, which makes the training command
    checkpoint at its next step, so that the run resumes there (a second
    would end it at once, unsaved); SIGKILL to those not ended `GRACE`
    seconds later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc, group in procs:
            try:
                if group:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline, left = time.monotonic() + GRACE, []
        for proc, group in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                left.append((proc, group))
        procs = left
        if not procs:
            return


def stderr(directory):
    """What the run in `directory` wrote to its stderr."""
    with open(os.path.join(directory, "stderr.txt")) as f:
        return f.read().strip()


def set_aside(directory):
    """Renames a run's folder to `<folder>.incomplete-<n>` (the first `n`
    free) so that its rerun starts afresh rather than resuming the short
    run; the new name, or None where there is no folder."""
    if not os.path.isdir(directory):
        return None
    n = 1
    while os.path.exists(f"{directory}.incomplete-{n}"):
        n += 1
    os.rename(directory, f"{directory}.incomplete-{n}")
    return f"{directory}.incomplete-{n}"


def run(specs, record_path, work_dir, workers=2, budget=0.0, data_dir="",
        log=print, env=None):
    """Runs the specs not yet in the record (nor failed there), `workers`
    processes at a time, in order. `specs` is a list, or a function of the
    record's runs returning one (a plan's `all_specs`): asked again after
    each finished run, so that runs waiting on others (a sweep's best rate)
    start as soon as they can. With `budget` (seconds) no run starts after
    it has passed (nor a task expected to end after it), and runs still
    going at its end are stopped (a training run's epoch checkpoints let a
    rerun resume it). A failed run is logged with its stderr's last line
    and not started again by this call; a failed task is also recorded.
    The processes start from `env` (default this one's environment).
    Returns the runs finished by this call; raises `NoGPU` where a task
    exited `NO_GPU`. On SIGTERM (or SIGINT) it stops every run it started
    (`stop_all`: a training run saves at its next step), logs each, and
    raises `Stopped` (exit 143, or 130)."""
    plan = specs if callable(specs) else (lambda runs: specs)
    deadline = time.monotonic() + budget if budget else float("inf")
    busy, finished, tried, said, short = {}, [], set(), set(), set()
    longest = {}  # A task's (part, backend): the longest one in this call.

    def todo(runs):
        done = runspec.finished_keys(runs) | tried | {
            runspec.run_key(r) for r in records.failures(record_path)}
        short.update(runspec.run_key(r) for r in runs
                     if runspec.incomplete(r))
        left = [s for s in plan(runs) if runspec.run_key(s) not in done]
        absent = collections.Counter(
            s["run_backend"] for s in left
            if "run_backend" in s and not installed(s["run_backend"]))
        for backend in set(absent) - said:
            said.add(backend)
            log(f"{backend} is not installed here: its {absent[backend]} "
                "run(s) wait for a call where it is")
        return [s for s in left if s.get("run_backend") not in absent]

    # Both handled here, not left to Python's default: a runner started in
    # the background by a shell inherits SIGINT ignored.
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, _stopped) for s in SIGNALS} if main else {}
    try:
        waiting, closed = todo(records.load(record_path)), False
        while waiting or busy:
            while waiting and len(busy) < workers and not closed:
                spec, clock = waiting[0], time.monotonic()
                part = (spec.get("part"), spec.get("run_backend"))
                cost = longest.get(part, 0) if "module" in spec else 0
                if clock + cost > deadline:
                    closed = clock < deadline
                    if closed:
                        log(f"not started {runspec.run_key(spec)}: it "
                            f"would end after the budget ({cost:.0f} s, "
                            f"{deadline - clock:.0f} s left)")
                    break
                waiting.pop(0)
                tried.add(runspec.run_key(spec))
                if runspec.run_key(spec) in short:
                    aside = set_aside(runspec.model_dir(spec, work_dir))
                    log(f"again {runspec.run_key(spec)}: its record is "
                        "short" + (f"; its folder set aside as {aside}"
                                   if aside else ""))
                _start_held(spec, work_dir, data_dir, env, busy, clock)
                log(f"start {runspec.run_key(spec)}")
            if closed or time.monotonic() >= deadline:
                waiting, closed = [], True
            time.sleep(POLL)
            for proc in list(busy):
                spec, started = busy[proc]
                took = time.monotonic() - started
                limit = spec.get("limit_seconds")
                over = limit is not None and took >= limit
                past = time.monotonic() >= deadline
                if proc.poll() is None and not over and not past:
                    continue
                busy.pop(proc)
                key = runspec.run_key(spec)
                directory = runspec.model_dir(spec, work_dir)
                task, code, record = "module" in spec, proc.poll(), None
                if code is None:
                    stop(proc, task)
                    if past:
                        log(f"stopped {key} at the end of the budget")
                        continue
                    error = (stderr(directory)
                             + f"\ndid not finish within {limit:g} s").strip()
                elif task and code == NO_GPU:
                    stop_all([(other, "module" in busy[other][0])
                              for other in busy])
                    said = (stderr(directory).splitlines() or ["exit 3"])[-1]
                    raise NoGPU(f"{key}: {said}; it needs a GPU")
                else:
                    record = (None if code else
                              runspec.collect(spec, directory, took))
                    error = stderr(directory) or f"exit {code}"
                    if not code:
                        error += "\nno RESULT line"
                if record is None:
                    line = (error.splitlines() or ["?"])[-1]
                    log(f"{'failed' if task else 'stopped'} {key} ("
                        + ("time limit" if code is None else f"exit {code}")
                        + f"): {line}")
                    if task:
                        records.save(
                            record_path, records.load(record_path),
                            failed=records.failures(record_path) + [dict(
                                spec, error=error[-2000:],
                                **provenance.stamp(spec),
                                wall_seconds=round(took, 1))])
                    continue
                if task:
                    cost = (spec.get("part"), spec.get("run_backend"))
                    longest[cost] = max(longest.get(cost, 0), took)
                record.update(provenance.stamp(spec))
                records.add(record_path, record,
                            updated=datetime.date.today().isoformat())
                runs = records.load(record_path)
                finished.append(record)
                log(f"done {key}" + (f": val {record['val_accuracy']:.4f}"
                                     if "val_accuracy" in record else
                                     f" ({took:.0f} s)" if task else ""))
                if not closed:
                    waiting = todo(runs)
        return finished
    except (Stopped, KeyboardInterrupt) as e:
        # Every run stopped first (the training command saves at its next
        # step), so that a rerun resumes them and none is left running; a
        # second signal ends the runner at once, its runs already told.
        code = e.code if isinstance(e, Stopped) else 128 + signal.SIGINT
        why = signal.Signals(code - 128).name
        stop_all([(proc, "module" in spec)
                  for proc, (spec, _) in busy.items()])
        for spec, _ in busy.values():
            log(f"stopped {runspec.run_key(spec)}: the runner got {why}; "
                "run it again to resume")
        raise Stopped(code) from None
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)
