"""The study: plans (`plans`), the one runner and record writer (`runner`),
statistics (`stats`), the report (`report`, the page, from `selection`,
`findings`, `baselines`, `depth`, `tables`, `appendix`, `show`, `probes`),
the GPU check's tasks as specs (`gpu_check`) and the `kills` plan's
program. `python -m bench.study run|report|list|merge ...`
(`__main__`)."""
