"""The GPU check: `python -m bench.gpu_campaign ...` (`__main__`: the
arguments, each part's tasks of a call, part c, the budget, `--prepare`),
run by the study's runner (`bench/study/runner.py`) from the plans
`gpu_check` and `gpu_smoke` (`bench/study/gpu_check.py`); `tasks` (the
tasks' processes), `report` (`<out>.md`), `convert` (the campaign's old
records into the runner's), `rehearsal.sh` (the GPU image on a CPU). What
it measures and how to run it: bench/README.md."""
