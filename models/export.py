"""Export a checkpoint's encoder to formats other libraries load.

  to_onnx(checkpoint, out_dir)   the encoder as an ONNX graph (out_dir/model.onnx) beside its
      tokenizer (out_dir/tokenizer.json). Tokenization stays in Python: the graph's inputs are the
      arrays `tokenizer.encode(texts)` returns, under the same names (int64, (batch, length), 0 =
      padding; DAN: `words` and `bigrams`, Transformer and pretrained: `ids`); its output
      `sentence_embedding` is (batch, dim), unit length, as `encode` gives. `OnnxEncoder(out_dir)
      .encode(texts)` runs it with onnxruntime. The export is checked against torch on a few
      sentences before it is kept.

  to_sentence_transformers(checkpoint, out_dir)   the pretrained-transformer encoder as a
      sentence-transformers folder: `SentenceTransformer(out_dir).encode(texts)` gives the
      checkpoint's embeddings (Transformer -> Pooling (the checkpoint's mean|cls|max) -> optional
      Dense projection -> Normalize), with the checkpoint's tokenizer and length limit.

The checkpoint normalizes text before tokenizing (HTML entities unescaped, URLs replaced by a
marker, spaces squeezed: convsts.datasets.text.normalize); the sentence-transformers folder's tokenizer
does the same as its first normalizer (convsts.datasets.text.hf_normalizer: every HTML5 named
reference and the numeric references `normalize` unescapes), so the two give the same text on any
input.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch
from tokenizers import Tokenizer, normalizers
from torch import nn

from convsts.datasets.text import hf_normalizer, load_tokenizer, save_tokenizer
from convsts.io.errors import BadInputError
from convsts.io.folders import staging_folder
from convsts.models.encoders import PretrainedEncoder
from convsts.models.heads import MultitaskModel
from convsts.models.quiet_logging import quiet_loggers
from convsts.models.sentence_encoder import load

ONNX_FILE = "model.onnx"
ONNX_TOKENIZER = "tokenizer.json"  # the ONNX folder's tokenizer, in convsts' own format (save_tokenizer)
ONNX_OUTPUT = "sentence_embedding"
ONNX_OPSET = 18
ONNX_TOLERANCE = 1e-4  # max |onnxruntime - torch| accepted by the export's own check
CHECK_TEXTS = [
    "A man is playing a guitar.",
    "",
    "Two dogs run through a field of tall grass near the river bank.",
    "what's the best way to learn python? https://example.com",
]


def _empty_out(out_dir: str | Path) -> Path:
    """--out as an absolute folder that is new or empty, and not the working folder or one above it
    (it is written beside and renamed into place); BadInputError otherwise."""
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BadInputError(f"{out_dir}: already exists and is not empty; give a new --out")
    if Path.cwd().resolve().is_relative_to(out_dir):
        raise BadInputError(f"{out_dir}: the working folder (or one above it); give a new folder as --out")
    return out_dir


def _publish(partial: Path, out_dir: Path) -> Path:
    """Rename a completely written folder into place: a cut export leaves no folder to load."""
    if out_dir.exists():
        out_dir.rmdir()  # empty (checked before writing)
    partial.rename(out_dir)
    return out_dir


class _GraphEncoder(nn.Module):
    """encode() as a function of the tokenizer's id arrays, in the order of `names`."""

    def __init__(self, model: MultitaskModel, names: Sequence[str]):
        super().__init__()
        self.model = model
        self.names = list(names)

    def forward(self, *ids: torch.Tensor) -> torch.Tensor:
        return self.model.encode(dict(zip(self.names, ids)))  # (B, dim), unit length


class OnnxEncoder:
    """An exported folder run with onnxruntime: `OnnxEncoder(dir).encode(texts)` -> (n, dim) float32."""

    def __init__(self, folder: str | Path, threads: int = 0):
        import onnxruntime as ort

        folder = Path(folder)
        self.tokenizer = load_tokenizer(folder / ONNX_TOKENIZER)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime's default (one per core)
        self.session = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def encode(self, sentences: str | Sequence[str], batch_size: int = 256) -> np.ndarray:
        single = isinstance(sentences, str)
        texts: list[str] = [sentences] if isinstance(sentences, str) else list(sentences)
        tokens = self.tokenizer.encode(texts)  # {name: (n, L)}
        first = tokens[self.names[0]]
        lengths = (first != self.tokenizer.pad_id).sum(1)  # (n,)
        order = np.argsort(-lengths, kind="stable")  # longest first, as SentenceEncoder.encode batches
        out = np.zeros((len(texts), self.session.get_outputs()[0].shape[1]), dtype=np.float32)  # (n, dim)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            width = max(1, int(lengths[rows].max()))
            feed = {n: np.ascontiguousarray(tokens[n][rows, :width], dtype=np.int64) for n in self.names}
            out[rows] = self.session.run([ONNX_OUTPUT], feed)[0]  # (b, dim)
        return out[0] if single else out


# torch.onnx and onnxscript report each graph pass at INFO and warn about optional packages
# (torchvision); the export's result is what the caller reports.
EXPORT_LOGGERS = ("torch.onnx", "torch.export", "onnxscript", "onnx_ir")
ST_EXPORT_LOGGERS = ("transformers", "sentence_transformers")


def finite_encoder(checkpoint: str | Path):
    """The loaded checkpoint, refused in one line naming the first encoder tensor that holds NaN or
    inf (a run that diverged): an export of it would be checked in vain or write a model of NaNs."""
    loaded = load(checkpoint)
    for name, tensor in loaded.model.encoder.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise BadInputError(
                f"{checkpoint}: the encoder's tensor {name} holds {bad:,} NaN or inf value(s) (the run diverged); "
                "export an earlier checkpoint"
            )
    return loaded


def to_onnx(checkpoint: str | Path, out_dir: str | Path) -> Path:
    loaded = finite_encoder(checkpoint)
    out_dir = _empty_out(out_dir)
    sample = loaded.tokenizer.encode(CHECK_TEXTS)  # {name: (n, L)}
    names = list(sample)
    args = tuple(torch.from_numpy(np.ascontiguousarray(sample[n], dtype=np.int64)) for n in names)
    axes = {0: "batch", 1: "length"}
    partial = staging_folder(out_dir)  # this export's own folder: never one of the user's
    try:
        with torch.no_grad(), quiet_loggers(EXPORT_LOGGERS):
            torch.onnx.export(
                _GraphEncoder(loaded.model, names).eval(),
                args,
                str(partial / ONNX_FILE),
                dynamo=True,
                input_names=names,
                output_names=[ONNX_OUTPUT],
                dynamic_shapes=((axes,) * len(names),),
                opset_version=ONNX_OPSET,
                external_data=False,
                verbose=False,
            )
        save_tokenizer(loaded.tokenizer, partial / ONNX_TOKENIZER)
        got = OnnxEncoder(partial).encode(CHECK_TEXTS, batch_size=2)  # (n, dim); batches of other widths
        diff = float(np.abs(got - loaded.encode(CHECK_TEXTS)).max())
        if not diff <= ONNX_TOLERANCE:
            raise RuntimeError(f"{checkpoint}: the ONNX graph differs from torch by {diff:.2e} (> {ONNX_TOLERANCE})")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-written is left under --out's name
        raise
    return _publish(partial, out_dir)


def to_sentence_transformers(checkpoint: str | Path, out_dir: str | Path) -> Path:
    from transformers.utils import (
        logging as hf_logging,
    )

    loaded = finite_encoder(checkpoint)
    encoder = loaded.model.encoder
    if not isinstance(encoder, PretrainedEncoder):
        raise BadInputError(
            f"{checkpoint}: a {loaded.model.config.encoder} encoder; the sentence-transformers "
            f"format holds the pretrained-transformer encoder (model.encoder=pretrained) only"
        )
    out_dir = _empty_out(out_dir)
    # Saving reports progress bars and info lines, and reloading the saved transformer reports its
    # pooler as "newly initialized" (sentence-transformers pools the token embeddings and never runs
    # it): all of it would only look like a failure. The command reports the result in one line.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_loggers(ST_EXPORT_LOGGERS):
            return _sentence_transformers_folder(loaded, encoder, out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _sentence_transformers_folder(loaded, encoder: PretrainedEncoder, out_dir: Path) -> Path:
    from sentence_transformers import (
        SentenceTransformer,
    )
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import (
        PreTrainedTokenizerFast,
    )

    max_len = loaded.tokenizer.config.max_words  # special tokens included, as max_seq_length counts them
    with tempfile.TemporaryDirectory() as tmp:
        encoder.model.save_pretrained(tmp)  # config.json + model.safetensors of the fine-tuned transformer
        hf_tokenizer = Tokenizer.from_str(loaded.tokenizer.to_dict()["hf_tokenizer"])
        # encode() normalizes text (entities, URLs, spaces) before this tokenizer: so does the export's
        own = [hf_tokenizer.normalizer] if hf_tokenizer.normalizer is not None else []
        hf_tokenizer.normalizer = normalizers.Sequence([hf_normalizer(), *own])
        PreTrainedTokenizerFast(
            tokenizer_object=hf_tokenizer,
            model_max_length=max_len,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        ).save_pretrained(tmp)
        hidden = encoder.model.config.hidden_size
        modules = [Transformer(tmp, max_seq_length=max_len), Pooling(hidden, pooling_mode=encoder.config.pooling)]
        if encoder.config.output_dim:
            linear = cast(torch.nn.Linear, encoder.projection)
            modules.append(
                Dense(
                    hidden,
                    encoder.config.output_dim,
                    activation_function=torch.nn.Identity(),
                    init_weight=linear.weight.detach().clone(),
                    init_bias=linear.bias.detach().clone(),
                )
            )
        modules.append(Normalize())
        # Written beside the target and renamed when complete: a cut export leaves no folder to load.
        partial = staging_folder(out_dir)  # this export's own folder: never one of the user's
        try:
            SentenceTransformer(modules=modules, device="cpu").save(str(partial))
            _readable_as_created(partial)  # the weights file comes out 0600 (written through a temporary file)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return _publish(partial, out_dir)


def _readable_as_created(folder: Path) -> None:
    """Every file under `folder` with the mode a new file gets here (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)
