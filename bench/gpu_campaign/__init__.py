"""The GPU check: `python -m bench.gpu_campaign ...` (`__main__`: the
arguments, each part's tasks of a call, part c, the budget, `--prepare`),
run by bench's process pool (`bench/core/pool.py`) from the plans
`GPU_CHECK` and `GPU_SMOKE` (`plan.py`, the check's plan in one place);
`tasks` (the tasks' processes), `report` (`<out>.md`), `rehearsal.sh` (the
GPU image on a CPU). What
it measures and how to run it: bench/README.md."""
