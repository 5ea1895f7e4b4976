from pathlib import Path

import pytest

from convsts.io.dotted import flatten
from convsts.io.errors import ConfigError
from convsts.io.storage import resolve_path, sample_dir
from convsts.ray_jobs.config.loader import from_dict, load_config


def test_defaults_follow_the_paper():
    cfg = load_config()
    assert cfg.trainer.task_weights == {"reddit": 0.95, "snli": 0.05}
    assert [(s.batch_size, s.lr) for s in cfg.trainer.stages] == [(128, 0.01), (256, 0.001)]
    assert cfg.model.dan.hidden_sizes == [300, 300] and cfg.model.dan.output_dim == 500
    assert cfg.model.transformer.num_layers == 6 and cfg.model.transformer.num_heads == 8


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  steps: 7\n  optimizer: adam\nmodel:\n  dan:\n    hidden_sizes: [16]\n")
    cfg = load_config(path, ["trainer.steps=9", "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.5}]"])
    assert cfg.trainer.steps == 9 and cfg.trainer.optimizer == "adam"
    assert cfg.model.dan.hidden_sizes == [16]
    assert cfg.trainer.stages[0].batch_size == 4 and cfg.trainer.stages[0].lr == 0.5


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.stepz=3", "trainer.stepz"),
        ("trainer.steps=many", "trainer.steps"),
        ("model.dan.width=3", "model.dan.width"),
    ],
)
def test_bad_overrides_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_unknown_key_in_yaml_names_key_and_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  step: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "trainer.step" in str(err.value) and str(path) in str(err.value)


def test_semantic_validation():
    with pytest.raises(ConfigError, match="task_weights"):
        load_config(None, ["trainer.task_weights={reddit: 1.0, wiki: 1.0}"])
    with pytest.raises(ConfigError, match="snli_fraction"):
        load_config(None, ["data.snli_fraction=1.5"])
    with pytest.raises(ConfigError, match="override"):
        load_config(None, ["trainer.steps"])


def test_snli_fraction_zero_trains_the_other_tasks():
    """The data-quantity curve's origin: no SNLI pair, so SNLI leaves the trained tasks (and its head
    scale with it); a run of SNLI alone has nothing left to train and is refused naming why."""
    from convsts.ray_jobs.config.schema import SNLI_TASK
    from convsts.ray_jobs.tasks.snli import SnliTask

    assert SnliTask.name == SNLI_TASK
    cfg = load_config(None, ["data.snli_fraction=0", "trainer.head_lr_scale={snli: 50}"])
    assert cfg.trainer.task_weights == {"reddit": 0.95} and cfg.trainer.head_lr_scale == {}
    assert from_dict(cfg.to_dict()).trainer.task_weights == {"reddit": 0.95}  # as a checkpoint stores it
    with pytest.raises(ConfigError, match=r"task_weights.*data.snli_fraction=0"):
        load_config(None, ["data.snli_fraction=0", "trainer.task_weights={snli: 1.0}"])
    with pytest.raises(ConfigError, match=r"snli_fraction: expected a value in \[0, 1\]"):
        load_config(None, ["data.snli_fraction=-0.1"])


def test_round_trip_through_dict_and_flatten():
    cfg = load_config(None, ["trainer.steps=11"])
    again = from_dict(cfg.to_dict())
    assert again == cfg
    flat = flatten(cfg.to_dict())
    assert flat["trainer.steps"] == 11 and flat["model.encoder"] == "dan"


def test_sample_paths_resolve_to_shipped_files():
    cfg = load_config()
    assert resolve_path(cfg.data.snli_train).startswith(str(sample_dir()))
    assert (sample_dir() / "reddit_pairs.parquet").is_file()


def test_task_weights_are_replaced_not_merged(tmp_path):
    assert load_config(None, ["trainer.task_weights={reddit: 1.0}"]).trainer.task_weights == {"reddit": 1.0}
    path = tmp_path / "snli_only.yaml"
    path.write_text("trainer:\n  task_weights: {snli: 1.0}\n")
    assert load_config(path).trainer.task_weights == {"snli": 1.0}
    assert load_config(path, ["trainer.task_weights={reddit: 3, snli: 1}"]).trainer.task_weights == {
        "reddit": 3.0,
        "snli": 1.0,
    }
    # ... and the dict round trip that Ray workers and Tune trials use keeps them as they are.
    cfg = load_config(path)
    assert from_dict(cfg.to_dict()).trainer.task_weights == {"snli": 1.0}


def test_an_override_that_is_not_valid_yaml_is_one_line_naming_the_key_and_the_quoted_value():
    # Unquoted braces inside a list: PyYAML reads `{sample}` as a mapping and fails.
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.reddit_inputs=[{sample}/reddit_pairs.parquet, b:c]"])
    message = str(err.value)
    assert "\n" not in message and message.startswith("config key 'data.reddit_inputs': the value ")
    assert """'data.reddit_inputs=["{sample}/reddit_pairs.parquet", "b:c"]'""" in message
    # What OmegaConf itself reads stays accepted: a URI with a query inside an unquoted list.
    uri = "s3://bucket/dumps/RC_x.zst?region=eu&scheme=http"
    assert load_config(None, [f"data.reddit_inputs=[{uri}]"]).data.reddit_inputs == [uri]
    # The quoted form it suggests is read as meant.
    quoted = load_config(None, ['data.reddit_inputs=["{sample}/reddit_pairs.parquet", "b:c"]'])
    assert quoted.data.reddit_inputs == ["{sample}/reddit_pairs.parquet", str(Path("b:c").resolve())]


def test_a_bracket_never_closed_is_one_line_with_the_value_closed_not_quoted():
    """Quoting `[1,3` would only make it a string that is refused next: the advice closes it."""
    with pytest.raises(ConfigError) as err:
        load_config(None, ["trainer.num_workers=[1,3"])
    assert str(err.value) == (
        "config key 'trainer.num_workers': the value '[1,3' opens a bracket it never closes; did you mean "
        "'trainer.num_workers=[1,3]'?"
    )
    assert load_config(None, ["trainer.num_workers=[1,3]"]).trainer.worker_range == (1, 3)
    with pytest.raises(
        ConfigError,
        match=r"opens a bracket it never closes; did you mean 'trainer.stages=\[\{start_step: 0, batch_size: 8, lr: 0.1\}\]'",
    ):
        load_config(None, ["trainer.stages=[{start_step: 0, batch_size: 8, lr: 0.1"])


def test_an_error_inside_a_list_item_names_the_full_key(tmp_path):
    """The full path, not the item's own key ('lr'): the path is what the user edits."""
    stages = "[{start_step: 0, batch_size: 8, lr: 0.1}, {start_step: 10, batch_size: 8, lr: abc}]"
    with pytest.raises(ConfigError, match=r"^config key 'trainer.stages\[1\].lr' in command-line overrides: "):
        load_config(None, [f"trainer.stages={stages}"])
    path = tmp_path / "c.yaml"
    path.write_text(
        "trainer:\n  stages:\n    - {start_step: 0, batch_size: 8, lr: 0.1}\n    - {start_step: 5, lrr: 1}\n"
    )
    with pytest.raises(ConfigError, match=rf"^config key 'trainer.stages\[1\].lrr' in {path}: Key 'lrr' not in"):
        load_config(path)


def test_a_long_yaml_list_loads_and_an_alias_bomb_is_still_refused(tmp_path):
    long = tmp_path / "long.yaml"
    # 1,500 stages are 10,500 YAML nodes, past PyYAML's guard against alias bombs ("exceeds ... 10000")
    stages = "".join(f"    - {{start_step: {i * 10}, batch_size: 8, lr: 0.1}}\n" for i in range(1500))
    long.write_text("trainer:\n  stages:\n" + stages)
    assert len(load_config(long).trainer.stages) == 1500
    bomb = tmp_path / "bomb.yaml"
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]  # 10^7 nodes
    bomb.write_text("\n".join(levels) + "\n")
    with pytest.raises(ConfigError, match=f"cannot parse config file {bomb}"):
        load_config(bomb)
