"""The study: plans (`plans`), the one runner and record writer (`runner`),
statistics (`stats`), the report (`report`, `probes`) and the `kills`
plan's program. `python -m bench.study run|report|list|merge ...`
(`__main__`)."""
