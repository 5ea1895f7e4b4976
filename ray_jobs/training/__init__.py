"""Training library: the Ray-free step and loop (step.py, state.py, loop.py), the Ray Data feed
(data.py), the Ray Train worker (worker.py) and the driver that runs a training job (driver.py)."""
