"""A run, from the parsed command line to its exit code.

`driver` (parses once, places, assembles the run part by part, then
fits or evaluates), `placement` (`Devices`: where the run computes),
`processes` (several JAX or torch processes, and the supervisor of a JAX
job's processes), `callbacks` (the callbacks of `fit`, in order),
`evaluate` (`--mode=eval`), `divergence` (a diverged run stops, exit
code 3), `interrupt` (Ctrl-C or SIGTERM: a checkpoint at the next step,
one line, exit code 130 or 143) and `banner` (what a run says before it
trains).
"""
