"""The GPU check: `python -m bench.gpu_campaign ...` (`__main__`: the
arguments, each part's items, parts cuda and c, `--prepare`), `campaign`
(a process per task and the tasks they run, the budget, the record),
`report` (`<out>.md`), `rehearsal.sh` (the GPU image on a CPU). What it
measures and how to run it: bench/README.md."""
