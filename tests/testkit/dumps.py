"""bench/prepare_pushshift.py as a module: its synthetic pushshift dump (`write_dump`), the plain
single-process reference (`reference`) and `prepared_rows`, for the tests that prepare dumps."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "prepare_pushshift.py"


def prepare_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_pushshift", BENCH)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench
