"""Micro-benchmarks, one per measured speed claim, each run as
`python -m bench.micro.<name>` from the repository's root."""
