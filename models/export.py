"""Export a checkpoint's encoder to formats other libraries load.

  to_sentence_transformers(checkpoint, out_dir)   the pretrained-transformer encoder as a
      sentence-transformers folder: `SentenceTransformer(out_dir).encode(texts)` gives the
      checkpoint's embeddings (Transformer -> Pooling (the checkpoint's mean|cls|max) -> optional
      Dense projection -> Normalize), with the checkpoint's tokenizer and length limit.

The checkpoint normalizes text before tokenizing (HTML entities unescaped, URLs replaced by a
marker, spaces squeezed: datasets.text.normalize); sentence-transformers tokenizes the raw text, so
texts with URLs or HTML entities can embed differently there.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from datasets.storage import BadInputError
from models.checkpoint import load


def to_sentence_transformers(checkpoint: str | Path, out_dir: str | Path) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    loaded = load(checkpoint)
    encoder = loaded.model.encoder
    if getattr(encoder, "tokenizer_kind", None) != "pretrained":
        raise BadInputError(f"{checkpoint}: a {loaded.model.config.encoder} encoder; the sentence-transformers "
                            f"format holds the pretrained-transformer encoder (model.encoder=pretrained) only")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BadInputError(f"{out_dir}: already exists and is not empty; give a new --out")
    max_len = loaded.tokenizer.config.max_words  # special tokens included, as max_seq_length counts them
    with tempfile.TemporaryDirectory() as tmp:
        encoder.model.save_pretrained(tmp)  # config.json + model.safetensors of the fine-tuned transformer
        hf_tokenizer = Tokenizer.from_str(loaded.tokenizer.to_dict()["hf_tokenizer"])
        PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer, model_max_length=max_len, unk_token="[UNK]",
                                pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                mask_token="[MASK]").save_pretrained(tmp)
        hidden = encoder.model.config.hidden_size
        modules = [Transformer(tmp, max_seq_length=max_len), Pooling(hidden, pooling_mode=encoder.config.pooling)]
        if encoder.config.output_dim:
            linear = encoder.projection
            modules.append(Dense(hidden, encoder.config.output_dim, activation_function=torch.nn.Identity(),
                                 init_weight=linear.weight.detach().clone(), init_bias=linear.bias.detach().clone()))
        modules.append(Normalize())
        # Written beside the target and renamed when complete: a cut export leaves no folder to load.
        partial = out_dir.with_name(out_dir.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        SentenceTransformer(modules=modules, device="cpu").save(str(partial))
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        partial.rename(out_dir)
    return out_dir
