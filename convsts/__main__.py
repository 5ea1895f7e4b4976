"""`python -m convsts CMD ...`, the same as the `convsts` command."""

from convsts.ray_jobs.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
