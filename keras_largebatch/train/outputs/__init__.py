"""What a run writes in `model_dir` besides its checkpoints: its records
(the summary, a row per epoch, the evaluations within epochs), the
learning curves, TensorBoard scalars and the `.keras` files (each file's
name, and what it holds: `train/layout.py`).

Nothing is written before every input has been checked; each file is
written to a temporary name in the same folder and renamed over the old
one, so a failed run never leaves a half-written file.

`files` reads history.csv back and draws learning_curves.png,
`callbacks` report the run while it trains, `exported` writes every
`.keras` file (`save_keras`), `report` writes run_config.json,
summary.json and the closing line around `fit` (every JSON file through
`_shared.write_json`).
"""
