"""Training library: the Ray-free step and loop (train_step.py, loop.py, with start_weights.py,
schedule.py, train_state.py, metric_window.py), the feed each worker reads its tasks' shards through (data_feed.py), the Ray Train
worker (worker.py), the driver that runs a training job (driver.py: the checks before it in
start_checks.py, its TorchTrainer in ray_trainer.py, what it reports in reporting.py) and an --out
folder's lineage (lineage.py)."""
