"""Our top-level `datasets` package shadows Hugging Face `datasets`: imports must resolve to ours,
and MLflow's dataset features (which import `datasets` lazily) must keep working."""

from pathlib import Path

import pandas as pd


def test_datasets_resolves_to_convsts():
    import datasets

    assert Path(datasets.__file__).resolve().parent == Path(__file__).resolve().parent.parent / "datasets"
    from datasets import reddit, snli, text  # noqa: F401


def test_mlflow_dataset_logging_works_beside_our_package(mlflow_uri, tmp_path):
    import datasets  # noqa: F401  (ours, already imported: the case that could confuse MLflow)
    import mlflow
    from mlflow.tracking import MlflowClient

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
