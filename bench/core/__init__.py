"""bench's core: what the study (`bench/study/`), the micro-benchmarks
(`bench/micro/`) and the GPU check (`bench/gpu_campaign/`) share.

- `provenance.py`: where, when and with what code a measurement ran (the
  machine stamp, its kind, the commit and versions);
- `records.py`: a record file (`bench/results/<name>.json`): its runs,
  failed tasks, and the atomic write;
- `runspec.py`: a run spec (a training run of the command, a program or a
  task), its key, its folder, its process and what it records;
- `pool.py`: the process pool that runs specs within a time budget into a
  record, skipping what it holds.
"""
