"""The page's tables of the records no comparison reads: the backends'
training speed (`backend_speed`), kill and resume (`kills`), and the
retired studies' records (`RETIRED`), which no plan writes, as frozen
text."""

import os

from bench.core import records
from bench.study import kills
from bench.study import engine
from bench.study import show
from bench.study import stats

# Records of retired studies: no plan writes them, so their tables on the
# page are frozen text (`RETIRED_PAGE`), written once from these records.
RETIRED = ("study_backends", "adaptive_batch_study", "adaptive_batch_study_8",
           "adaptive_batch_seeds", "noise_scale_sweeps",
           "large_batch_study_digits", "critical_batch_probe")
RETIRED_PAGE = "retired_studies.md"


def retired_lines(results=records.RESULTS):
    """Each retired study's runs, one row each: `RETIRED_PAGE` as it is."""
    with open(os.path.join(results, RETIRED_PAGE)) as f:
        return [""] + f.read().splitlines()


def speed_lines(results=records.RESULTS):
    """The `backend_speed` plan: second-epoch training images/s per machine
    and backend, the mean of the runs side by side (a run whose last epoch
    timed nothing left out)."""
    rows = {}
    for r in records.load(engine.PLANS["backend_speed"].path(results)):
        if r["images_per_sec_per_epoch"][-1] is None:
            continue  # Resumed at its last step: that epoch timed nothing.
        rows.setdefault((r["machine"].rsplit(",", 1)[0], r["batch"]), []).append(
            r["images_per_sec_per_epoch"][-1])
    return ["| machine (backend) | batch | images/s (mean of the runs side by "
            "side) |", "|---|---|---|"] + [
        f"| {m} | {b:,} | {sum(v) / len(v):,.0f} (n={len(v)}) |"
        for (m, b), v in sorted(rows.items())]


def kill_lines(results=records.RESULTS):
    """The `kills` plan: per setup and fault (none, or the newest checkpoint
    damaged after the kill), its kills, the identical resumes, the updates
    a kill lost and a kill's seconds (kill and rerun)."""
    lines = ["| setup | fault | machine | kills | identical resumes | updates "
             "lost: max | median | seconds a kill |",
             "|---|---|---|---|---|---|---|---|"]
    runs = records.load(engine.PLANS["kills"].path(results))
    for fault in (None, "damage"):
        for setup in kills.SETUPS:
            mine = [r for r in runs
                    if r["setup"] == setup and r.get("fault") == fault]
            lost = [r["steps_lost"] for r in mine
                    if r["steps_lost"] is not None]
            if mine:
                median = show.number(stats.median(lost), 1) if lost else "–"
                lines.append(
                    f"| {setup} | {fault or 'none'} | {mine[-1]['machine']} | "
                    f"{len(mine)} | {sum(r['identical'] for r in mine)} | "
                    f"{max(lost, default='–')} | "
                    f"{median} | "
                    f"{stats.median([r['wall_seconds'] for r in mine]):.0f} |")
    return lines
