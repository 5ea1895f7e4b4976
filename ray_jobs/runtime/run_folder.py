"""The names in a run's --out folder, said once: what `convsts train`, `demo`, `tune` and `evaluate`
write there and read back. training.lineage decides what the chain's files hold; this module only
names them, low in the layers so that every module that needs a name (the tracking store's
default, the demo's sample) takes it from here."""

from __future__ import annotations

RUN_RECORD = "run.json"  # OUT's chain of runs (training.lineage)
TRAIN_SUMMARY = "train.json"  # written when a run finishes
CONFIG_FILE = "config.yaml"  # the resolved run config, as run
FINAL_CHECKPOINT = "checkpoint"  # a finished run's last checkpoint
MODEL_FOLDER = "model"  # the encoder without optimizer state, with its model card
BEST_FOLDER = "best_checkpoint"  # the best in-training STS-B dev (trainer.eval_every)
LOCAL_RESULTS = "ray_results"  # Ray Train's run folders without a trainer.storage_path
PREPARED_FOLDER = "prepared"  # the prepared data without --prepared or data.prepared_dir
LOSS_CURVES = "loss_curves.png"  # the per-task losses along OUT's chain
TRACKING_DB = "mlflow.db"  # the sqlite tracking store without a tracking URI
