"""convsts: a Ray-based multitask trainer for sentence encoders (Yang et al., 2018).

The one import package of this distribution. Its subpackages live in the repository's top-level
folders, and convsts/ holds a link to each: `convsts.datasets` (datasets/), `convsts.models`
(models/), `convsts.ray_jobs` (ray_jobs/) and `convsts.tune_spaces` (tune_spaces/). Python, a Ray
job's working_dir, editors and type checkers all follow the links; a wheel holds the folders
themselves under convsts/. Nothing of ours is a top-level module, so Hugging Face `datasets` and
any project's own `models` import normally beside it.
"""
