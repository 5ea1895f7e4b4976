"""Every reader of a checkpoint or model folder checks it against its manifest (load, evaluate,
export, the model folder a run hands out), and a read-only checkpoint is evaluated with its tuned
matrix written to --out only (real checkpoints, real evaluation on the embedded STS-B sample)."""

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from testkit.faults import tiny_checkpoint as faults_checkpoint

from convsts.io.errors import BadInputError
from convsts.models.checkpoint import MANIFEST_FILE, save_model_folder
from convsts.models.export import to_onnx
from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import FILE_NAME, load_sts_transform
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.pipelines.evaluate import run_evaluation


def test_a_checkpoint_whose_weights_were_replaced_is_refused_by_every_reader(tmp_path):
    """model.safetensors of another checkpoint of the same shapes (the same size, other weights):
    load, evaluate and export refuse it in one line naming the file; the untouched one loads."""
    first = faults_checkpoint(tmp_path / "first")
    other = faults_checkpoint(tmp_path / "other", embedding_dim=4)
    shutil.copy(first / "model.safetensors", tmp_path / "kept.safetensors")
    weights = {k: v + 1.0 for k, v in load_file(str(other / "model.safetensors")).items()}
    save_file(weights, str(first / "model.safetensors"))  # another run's weights, of the same shapes
    assert (first / "model.safetensors").stat().st_size == (tmp_path / "kept.safetensors").stat().st_size

    for read in (
        lambda: load(first),
        lambda: run_evaluation(load_config(None, []), tmp_path / "eval", checkpoint=str(first), log_to_mlflow=False),
        lambda: to_onnx(first, tmp_path / "st"),
    ):
        with pytest.raises(BadInputError) as refused:
            read()
        message = str(refused.value)
        assert message == (
            f"{first}: model.safetensors differs from its manifest's sha256 (replaced or damaged after it was "
            "written); refused"
        )
    assert not (tmp_path / "eval").exists() and not (tmp_path / "st").exists()
    shutil.copy(tmp_path / "kept.safetensors", first / "model.safetensors")
    assert load(first).encode("a man plays a guitar").shape == (6,)


def test_a_model_folder_has_a_manifest_and_a_cut_file_in_it_is_refused(tmp_path):
    model = save_model_folder(faults_checkpoint(tmp_path / "ckpt"), tmp_path / "model")
    assert (model / MANIFEST_FILE).is_file()
    assert load(model).encode("a woman sings").shape == (6,)
    data = (model / "tokenizer.json").read_bytes()
    (model / "tokenizer.json").write_bytes(data[:-10])
    with pytest.raises(BadInputError, match=r"not a complete checkpoint or model folder \(tokenizer.json has"):
        load(model)


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` made read-only for this process: immutable for root (who writes through permissions),
    else without write permission."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here: root writes through permissions")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    try:
        yield
    finally:
        folder.chmod(mode)


def test_a_read_only_checkpoint_is_evaluated_with_its_tuned_matrix_in_out(sample_checkpoint, tmp_path):  # noqa: F811
    cfg = load_config(None, ["eval.tuned.epochs=2"])
    before = sorted(p.name for p in sample_checkpoint.iterdir())
    with read_only(sample_checkpoint):
        results = run_evaluation(cfg, tmp_path / "eval", checkpoint=str(sample_checkpoint), log_to_mlflow=False)
    assert -1 <= results["stsb_tuned/test/pearson"] <= 1
    assert sorted(p.name for p in sample_checkpoint.iterdir()) == before  # nothing written there
    assert (tmp_path / "eval" / FILE_NAME).is_file() and (tmp_path / "eval" / "results.json").is_file()
    assert load_sts_transform(tmp_path / "eval").dev_pearson == pytest.approx(results["stsb_tuned/dev/pearson"])


def test_a_bucket_that_does_not_exist_is_one_line_before_any_work(tmp_path):
    """trainer.storage_path in a bucket the store does not have: `convsts train` and `convsts tune`
    refuse it in one line naming the bucket (no credentials), before preparing data or starting Ray."""
    from testkit.s3_server import s3_endpoint

    with s3_endpoint("convsts-exists") as env:
        commands = (
            ["train", "--out", str(tmp_path / "t")],
            ["tune", "--space", "snli_fraction", "--out", str(tmp_path / "s")],
        )
        started = [  # each a fresh process, both at once
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "convsts",
                    *command,
                    "trainer.storage_path=s3://key:hunter2@no-such-bucket/runs",
                ],
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for command in commands
        ]
        for command, process in zip(commands, started, strict=True):
            stdout, stderr = process.communicate(timeout=300)
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert process.returncode == 2 and len(lines) == 1, stderr[-3000:]
            assert lines[0].startswith(
                f"convsts {command[0]}: trainer.storage_path: the bucket 'no-such-bucket' of s3://"
            )
            assert "does not exist" in lines[0] and "hunter2" not in stderr + stdout
        assert not (tmp_path / "t" / "prepared").exists() and not (tmp_path / "t" / "mlflow.db").exists()


def test_a_folder_another_process_here_hashed_is_not_hashed_again_while_its_files_are_unchanged(tmp_path):
    """The driver hashes a checkpoint in its checks and hands its workers what it hashed (Hashed): a
    worker on the same machine reads the files' sizes and times, not their bytes, until one changes.
    Bytes read are the process's own count (/proc/self/io rchar)."""
    import os
    import pickle
    import subprocess
    import sys

    import torch
    from testkit.faults import tiny_checkpoint

    from convsts.models.checkpoint import TrainState, load_model, save_checkpoint, verified_folder

    def read_so_far() -> int:
        return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])

    small = load_model(tiny_checkpoint(tmp_path / "small"))
    big = save_checkpoint(
        tmp_path / "big", small.model, small.tokenizer, {}, TrainState(3, [{"m": torch.zeros(16, 2**20)}])
    )
    hashing = "import pickle, sys; from convsts.models.checkpoint import hashed_here as h; sys.stdout.buffer.write(pickle.dumps(h(sys.argv[1])))"
    hashed = pickle.loads(
        subprocess.run([sys.executable, "-c", hashing, str(big)], capture_output=True, check=True).stdout
    )
    before = read_so_far()
    verified_folder(big, [hashed])
    assert read_so_far() - before < 2**20, read_so_far() - before  # sizes and times only
    os.utime(Path(big) / "train_state.pt")  # touched: its time differs from the one hashed
    before = read_so_far()
    verified_folder(big, [hashed])
    assert read_so_far() - before > 64 * 2**20  # hashed here, every byte
