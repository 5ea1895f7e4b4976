"""Where a run or a model came from: the project's commit, library versions, the machine.

`git_commit()` reads the checkout the code runs from (CONVSTS_GIT_COMMIT wins: a submitted job's
working copy is not a git checkout, so `convsts submit` passes the commit it was sent from).
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMMIT_ENV = "CONVSTS_GIT_COMMIT"
LIBRARIES = ("convsts", "torch", "ray", "mlflow", "transformers", "tokenizers", "onnxruntime")


def git_commit(root: Path = PROJECT_ROOT) -> str | None:
    """The HEAD commit of the checkout at `root` (with "-dirty" when tracked files changed), or None."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def machine() -> dict[str, str]:
    import torch

    info = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": str(os.cpu_count())}
    try:
        if torch.cuda.is_available():
            info["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return info
