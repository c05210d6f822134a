"""The study: plans (`plans`, one table, made `Plan`s by `engine`), run
by bench's process pool (`bench/core/`), statistics (`stats`), the report (`report`, the page, from
`selection`, `findings`, `baselines`, `depth`, `momentum`, `audit`,
`tables`, `appendix`, `show`, `probes`; its findings table, written into
the study's page too: `headline`), the `kills` plan's program, and
`recheck` (a recorded run again at this code). `python -m bench.study
run|report|list|merge|recheck ...` (`__main__`)."""
