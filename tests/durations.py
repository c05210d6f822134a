"""tests/durations.json from the junit XML files a run of tests/run.sh
leaves in test-results/ (one a step):

    python tests/durations.py [test-results/*.xml]

It records each test's seconds and each file's (the most of any step; a
step is one environment and backend) and the steps' totals. tests/conftest.py
reads it: the costliest files start first, and a test over `SLOW_SECONDS`
is marked `slow` (`tests/run.sh --fast` leaves those out).
"""

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "durations.json")
SLOW_SECONDS = 10.0


def node_id(case):
    """'tests/train/test_train_cli.py::test_x[a]' of a junit <testcase>."""
    parts = case.get("classname", "").split(".")
    # classname is the module's dotted path, then any class names.
    for cut in range(len(parts), 0, -1):
        path = os.path.join(*parts[:cut]) + ".py"
        if os.path.exists(os.path.join(os.path.dirname(HERE), path)):
            return "::".join([path, *parts[cut:], case.get("name", "")])
    return None


def read(paths):
    """({step: {test: seconds}}) of the junit files `paths`."""
    steps = {}
    for path in paths:
        step = os.path.splitext(os.path.basename(path))[0]
        tests = steps.setdefault(step, {})
        for case in ET.parse(path).getroot().iter("testcase"):
            if case.find("skipped") is not None:
                continue
            test = node_id(case)
            if test:
                tests[test] = tests.get(test, 0.0) + float(case.get("time", 0))
    return steps


def summary(steps):
    per_test, per_file = {}, {}
    for tests in steps.values():
        files = {}
        for test, seconds in tests.items():
            per_test[test] = max(per_test.get(test, 0.0), seconds)
            path = test.split("::")[0]
            files[path] = files.get(path, 0.0) + seconds
        for path, seconds in files.items():
            per_file[path] = max(per_file.get(path, 0.0), seconds)
    return dict(
        note="written by tests/durations.py from tests/run.sh's junit files",
        slow_seconds=SLOW_SECONDS,
        steps={step: round(sum(tests.values()), 1)
               for step, tests in sorted(steps.items())},
        seconds_per_file={k: round(v, 1) for k, v in sorted(
            per_file.items(), key=lambda kv: -kv[1])},
        slow_tests={k: round(v, 1) for k, v in sorted(per_test.items())
                    if v > SLOW_SECONDS})


def main(argv):
    paths = argv[1:] or sorted(glob.glob(os.path.join(
        os.path.dirname(HERE), "test-results", "*.xml")))
    if not paths:
        print("durations.py: no junit files (run tests/run.sh first)",
              file=sys.stderr)
        return 2
    # Keep what earlier runs recorded of steps these files do not have.
    try:
        with open(OUT) as f:
            old = json.load(f).get("tests_by_step", {})
    except (OSError, ValueError):
        old = {}
    steps = dict(old, **read(paths))
    out = summary(steps)
    out["tests_by_step"] = {step: {k: round(v, 2) for k, v in sorted(t.items())}
                            for step, t in sorted(steps.items())}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(out['seconds_per_file'])} files, "
          f"{len(out['slow_tests'])} tests over {SLOW_SECONDS:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
