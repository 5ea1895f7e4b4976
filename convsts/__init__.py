"""convsts: a Ray-based multitask trainer for sentence encoders (Yang et al., 2018).

The one import package of this distribution. Its subpackages live in the repository's top-level
folders: `convsts.datasets` (datasets/), `convsts.models` (models/), `convsts.ray_jobs`
(ray_jobs/) and `convsts.tune_spaces` (tune_spaces/). An installed wheel holds them under
convsts/ (pyproject's package-dir); in a source tree (an editable install, or a Ray job whose
working_dir is the project folder) the folder above this one is on `__path__` as well, so the
same names resolve there. Nothing of ours is a top-level module, so Hugging Face `datasets` and
any project's own `models` import normally beside it.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "ray_jobs").is_dir() and (_HERE.parent / "ray_jobs" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))  # a source tree: convsts.<folder> is ../<folder>
