"""Training library: the Ray-free step and loop (train_step.py, loop.py, with start_weights.py,
schedule.py, train_state.py, metric_window.py), the feed (trainer.feed: each task's order in feed_order.py, its Ray Data pipeline in
feed_pipeline.py and dealer in feed_dealer.py read by dealt_stream.py, the local reader in
feed_reader.py and local_feed.py, what both share in data_feed.py; the tokenizer's training in
tokenizer_fit.py), the Ray Train
worker (worker.py), the driver that runs a training job (driver.py: the checks before it in
start_checks.py, its TorchTrainer in ray_trainer.py, what it reports in reporting.py) and an --out
folder's lineage (lineage.py)."""
