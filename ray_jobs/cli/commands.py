"""The commands of `convsts`: name -> (the module that runs it, its one-line help).

Each module is a recipe: `build_parser`, `main` and one library call. A Ray job's entrypoint runs
the same command as `python -m convsts COMMAND ...` (job_api.entrypoint). A command whose library
loads Ray, torch or MLflow imports it in `main`, once its arguments and config are checked, so that
`--help` and a config error answer in a fraction of a second (docs/performance.md "Start-up")."""

COMMANDS = {
    "prepare": ("convsts.ray_jobs.cli.prepare", "raw Reddit / SNLI inputs -> parquet shards + manifest (Ray Data)"),
    "mine-negatives": (
        "convsts.ray_jobs.cli.mine",
        "a prepared folder whose Reddit training pairs carry mined hard negatives",
    ),
    "train": ("convsts.ray_jobs.cli.train", "multitask training on Ray Train"),
    "evaluate": ("convsts.ray_jobs.cli.evaluate", "STS-B, Reddit P@N, SNLI, CQA metrics of a checkpoint or a baseline"),
    "tune": ("convsts.ray_jobs.cli.tune", "Ray Tune sweeps over a space in tune_spaces/ (sts_matrix, snli_fraction)"),
    "submit": ("convsts.ray_jobs.cli.submit", "submit one of these jobs to a Ray cluster (job API) and follow it"),
    "jobs": ("convsts.ray_jobs.cli.jobs", "list, show logs of, or stop jobs on a Ray cluster"),
    "export": ("convsts.ray_jobs.cli.export", "a checkpoint's encoder as ONNX or a sentence-transformers folder"),
    "demo": ("convsts.ray_jobs.cli.demo", "the whole pipeline on the embedded sample"),
}
