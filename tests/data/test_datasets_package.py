"""One import package: `convsts` and nothing else at the top level, so Hugging Face `datasets`
(installed by the test extra) imports normally beside ours, from any folder, the project's own
included; and MLflow's dataset features (which import `datasets` lazily) keep working."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]

BOTH = (
    "import datasets, convsts.datasets.reddit, convsts.models; "
    "from pathlib import Path; "
    "print(Path(datasets.__file__).resolve()); print(Path(convsts.datasets.reddit.__file__).resolve()); "
    "print(hasattr(datasets, 'load_dataset'))"
)


@pytest.mark.parametrize("where", ["elsewhere", "project"])
def test_hugging_face_datasets_imports_beside_convsts(where, tmp_path):
    cwd = REPO if where == "project" else tmp_path
    proc = subprocess.run([sys.executable, "-c", BOTH], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    theirs, ours, has_load = proc.stdout.split()
    assert Path(theirs).parent.parent.name == "site-packages" and Path(theirs).parent != REPO / "datasets", theirs
    assert ours == str(REPO / "datasets" / "reddit.py")
    assert has_load == "True"


def test_only_convsts_is_a_top_level_name_of_the_distribution():
    import sysconfig
    from importlib.metadata import distributions

    # The installed distribution (a build's convsts.egg-info in the project folder is not it).
    (dist,) = [d for d in distributions(path=[sysconfig.get_paths()["purelib"]]) if d.metadata["Name"] == "convsts"]
    assert (dist.read_text("top_level.txt") or "convsts").split() == ["convsts"]
    top = {Path(f).parts[0] for f in dist.files or [] if f.suffix == ".py" and not str(f).startswith("..")}
    # An editable install lists its finder module; a wheel lists convsts/ only.
    assert top <= {"convsts", "__editable___convsts_0_1_0_finder.py"}, top
    for name in ("models", "ray_jobs", "tune_spaces"):
        proc = subprocess.run(
            [sys.executable, "-c", f"import importlib.util as u; print(u.find_spec({name!r}))"],
            capture_output=True,
            text=True,
            cwd=Path("/"),
        )
        assert proc.stdout.strip() == "None", (name, proc.stdout, proc.stderr)


def test_mlflow_dataset_logging_works_beside_our_package(mlflow_uri, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    import convsts.datasets.text  # noqa: F401  (ours, already imported: the case that could confuse MLflow)

    frame = pd.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "score": [1.0]})
    source = tmp_path / "sts.parquet"
    frame.to_parquet(source)
    ds = mlflow.data.from_pandas(frame, source=str(source), name="sts-sample")
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("shadowing") or client.get_experiment(client.create_experiment("shadowing"))
    run = client.create_run(exp.experiment_id)
    client.log_inputs(run.info.run_id, [mlflow.entities.DatasetInput(ds._to_mlflow_entity())])
    client.log_param(run.info.run_id, "p", 1)
    client.set_terminated(run.info.run_id)
    got = client.get_run(run.info.run_id)
    assert got.inputs.dataset_inputs[0].dataset.name == "sts-sample"
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    assert resolve_dataset_source(str(source)) is not None
