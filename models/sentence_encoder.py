"""`SentenceEncoder`, what users hold: a checkpoint or model folder (models.checkpoint) loaded
with `encode` as sentence-transformers has it, and the task heads' scores. `load(path)` reads
one, local or at a URI, without Ray."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from convsts.models.checkpoint import model_from_files, read_model_files
from convsts.models.heads import MultitaskModel
from convsts.models.similarity import angular_score_from_cosine, cosine_matrix
from convsts.models.sts_transform import file_name as sts_file
from convsts.models.sts_transform import load_sts_transform, read_sts_transform


def resolve_device(device: str | None) -> torch.device:
    """ "cpu", "cuda", "cuda:N", or "auto"/None: CUDA when torch sees a GPU, else the CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class SentenceEncoder:
    """A loaded checkpoint with `encode` as SentenceTransformer has it, plus the task heads' scores:

    encoder = load("runs/demo/checkpoint")
    encoder.encode("a man is playing a guitar")            # (dim,) float32, unit length
    encoder.encode(["one", "two"], batch_size=64)           # (2, dim)
    encoder.encode(texts, device="cuda", convert_to_tensor=True, show_progress_bar=True)
    """

    PROGRESS_MIN_BATCHES = 8  # show_progress_bar=None: a bar for longer inputs when stderr is a terminal
    SORT_WINDOW = 64  # batches tokenized and sorted by length together (bounds the token arrays' memory)

    def __init__(self, model: MultitaskModel, tokenizer, meta: dict[str, Any], path: Path | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.meta = meta
        self.path = path

    @property
    def dim(self) -> int:
        return self.model.encoder.output_dim

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | None) -> SentenceEncoder:
        """Move the model to `device` (see resolve_device); token tensors follow it."""
        self.model.to(resolve_device(device))
        return self

    def _progress(self, n: int, batch_size: int, show: bool | None, desc: str):
        batches = -(-n // batch_size)
        asked = bool(show)
        if show is None:
            show = batches >= self.PROGRESS_MIN_BATCHES and sys.stderr.isatty()
        # A bar the caller asked for stays when done; an automatic one (evaluation's many encodes) clears itself.
        return tqdm(total=batches, desc=desc, unit="batch", disable=not show, leave=asked)

    def _texts(self, sentences: str | Sequence[str], device: str | None) -> tuple[list[str], bool]:
        """(the texts as a list, whether one string was given); moves the model when `device` is set."""
        if device is not None:
            self.to(device)
        single = isinstance(sentences, str)
        items: list[Any] = [sentences] if single else list(sentences)
        bad = next((i for i, text in enumerate(items) if not isinstance(text, str)), None)
        if bad is not None:  # None or NaN (a missing cell) would silently embed as "" or fail deep inside
            raise TypeError(f"encode: item {bad} is {type(items[bad]).__name__} {items[bad]!r}, not a string")
        return items, single

    def _embed_sorted(self, texts: list[str], batch_size: int, normalize: bool, bar) -> torch.Tensor:
        """(n, dim) on the model's device: the texts tokenized once, encoded longest first in batches cut
        to their own longest row (little padding for the Transformer and the pretrained encoder),
        returned in input order."""
        device = self.device  # token tensors follow the model
        tokens = self.tokenizer.encode(texts)  # {name: (n, L)}
        first = next(iter(tokens.values()))
        lengths = (first != self.tokenizer.pad_id).sum(1)  # (n,)
        order = np.argsort(-lengths, kind="stable")  # (n,)
        out = torch.zeros((len(texts), self.dim), device=device)  # (n, dim)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            width = max(1, int(lengths[rows].max()))
            inputs = {k: torch.from_numpy(np.ascontiguousarray(v[rows, :width])).to(device) for k, v in tokens.items()}
            out[torch.from_numpy(rows).to(device)] = self.model.encode(inputs, normalize=normalize).float()  # (b, dim)
            bar.update(1)
        return out

    def _embed(
        self, texts: list[str], batch_size: int, normalize: bool, show: bool | None, desc: str = "encode"
    ) -> torch.Tensor:
        window = batch_size * self.SORT_WINDOW
        with self._progress(len(texts), batch_size, show, desc) as bar:
            chunks = [
                self._embed_sorted(texts[i : i + window], batch_size, normalize, bar)
                for i in range(0, len(texts), window)
            ]
        return torch.cat(chunks) if chunks else torch.zeros((0, self.dim), device=self.device)

    @staticmethod
    def _output(emb: torch.Tensor, single: bool, convert_to_tensor: bool):
        emb = emb[0] if single else emb
        return emb if convert_to_tensor else emb.cpu().numpy().astype(np.float32)

    SIDES = ("context", "response")

    @torch.no_grad()
    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int = 256,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = False,
        device: str | None = None,
        normalize_embeddings: bool = True,
        tuned: bool | str = False,
        side: str = "context",
    ):
        """One string -> (dim,), a list -> (n, dim): numpy float32, or a torch tensor on the model's
        device with `convert_to_tensor=True`. Sentences are encoded longest first and returned in
        input order.
          device                "cpu", "cuda", "cuda:N" or "auto" (CUDA when available); the model
                                moves there; None keeps it where it is
          normalize_embeddings  unit length (default); False gives the encoder's output unnormalized
          show_progress_bar     a tqdm bar over batches; None = on for 8+ batches when stderr is a
                                terminal, cleared when done
          tuned                 True: apply the STS matrix `convsts evaluate` saved in the checkpoint;
                                a name: the checkpoint's matrix of that name; a path to a .safetensors
                                matrix file: that one (`convsts tune --space sts_matrix` writes DIR/sts_transform.safetensors)
          side                  "context": the shared encoder (STS, a Reddit context); "response": then
                                the response-side network (encode_responses)"""
        if side not in self.SIDES:
            raise ValueError(f"side={side!r}: use one of {', '.join(self.SIDES)}")
        texts, single = self._texts(sentences, device)
        if tuned and (side != "context" or not normalize_embeddings):
            raise ValueError(
                "tuned=True applies a matrix fit on unit-length context-side embeddings: keep "
                "normalize_embeddings=True and side='context'"
            )
        if side == "response":
            head = self.model.heads[self.model.task_of_head("response")]
            emb = head(self._embed(texts, batch_size, True, show_progress_bar, "encode responses"))  # (n, dim)
            emb = torch.nn.functional.normalize(emb, dim=-1) if normalize_embeddings else emb
        else:
            emb = self._embed(texts, batch_size, normalize_embeddings, show_progress_bar)  # (n, dim)
        if tuned:
            emb = torch.from_numpy(self._sts_transform(tuned).apply(emb.cpu().numpy())).to(
                emb.device
            )  # (n, dim) or (n, rank)
        return self._output(emb, single, convert_to_tensor)

    def _sts_transform(self, tuned: bool | str):
        """encode's `tuned`: the checkpoint's matrix (True, or a name), or a matrix file (a path ending .safetensors)."""
        if isinstance(tuned, str) and tuned.endswith(".safetensors"):
            if not Path(tuned).is_file():
                raise FileNotFoundError(f"tuned={tuned!r}: no such matrix file")
            return read_sts_transform(tuned)
        name = "" if tuned is True else str(tuned)
        transform = load_sts_transform(self.path, name) if self.path else None
        if transform is None:
            raise FileNotFoundError(
                f"no {sts_file(name)} in checkpoint {self.path}; run `convsts evaluate` on it first, or give "
                "tuned= the sts_transform.safetensors that `convsts tune --space sts_matrix` wrote"
            )
        return transform

    SIMILARITY_SCORES = ("cosine", "sts")

    def similarity(self, embeddings1, embeddings2, score: str = "cosine") -> torch.Tensor:
        """Every embedding of `embeddings1` against every one of `embeddings2` -> (n1, n2) float32
        on the first's device, as sentence-transformers' `similarity`; numpy arrays or tensors, one
        embedding (dim,) counting as one row.
          score  "cosine", or "sts": the paper's angular STS score, 5 (1 - arccos(cosine) / pi) on the
                 0-5 scale of STS gold scores (what `convsts evaluate` correlates with them)"""
        a, b = self._rows(embeddings1), self._rows(embeddings2)
        if a.shape[-1] != b.shape[-1]:
            raise ValueError(f"similarity: embeddings of {a.shape[-1]} and {b.shape[-1]} dimensions")
        return self._score(cosine_matrix(a, b.to(a.device)), score)  # (n1, n2)

    def similarity_pairwise(self, embeddings1, embeddings2, score: str = "cosine") -> torch.Tensor:
        """Row i of `embeddings1` against row i of `embeddings2` -> (n,), as sentence-transformers'
        `similarity_pairwise`; `score` as in `similarity`."""
        a, b = self._rows(embeddings1), self._rows(embeddings2)
        if a.shape != b.shape:
            raise ValueError(
                f"similarity_pairwise: {tuple(a.shape)} and {tuple(b.shape)} embeddings; give as many rows of one size"
            )
        return self._score(torch.nn.functional.cosine_similarity(a, b.to(a.device), dim=-1), score)  # (n,)

    @staticmethod
    def _rows(embeddings) -> torch.Tensor:
        """A tensor, an array, or a list of either -> (n, dim) float32."""
        if isinstance(embeddings, torch.Tensor):
            rows = embeddings
        elif isinstance(embeddings, (list, tuple)) and embeddings and isinstance(embeddings[0], torch.Tensor):
            rows = torch.stack(list(embeddings))
        else:
            rows = torch.from_numpy(np.asarray(embeddings, dtype=np.float32))
        return (rows.unsqueeze(0) if rows.dim() == 1 else rows).float()  # (n, dim)

    @classmethod
    def _score(cls, cos: torch.Tensor, score: str) -> torch.Tensor:
        if score not in cls.SIMILARITY_SCORES:
            raise ValueError(f"score={score!r}: use one of {', '.join(cls.SIMILARITY_SCORES)}")
        if score == "cosine":
            return cos
        return torch.from_numpy(angular_score_from_cosine(cos.cpu().numpy())).to(
            cos.device
        )  # the evaluation's own score

    def encode_responses(self, sentences: str | Sequence[str], **options):
        """Response embeddings after the response-side network (the right side of the Reddit score:
        context . response): `encode(sentences, side="response", ...)`, with `encode`'s options,
        unnormalized by default as the score uses them."""
        return self.encode(sentences, **{"normalize_embeddings": False, **options}, side="response")

    @torch.no_grad()
    def classify_nli(
        self,
        premises: str | Sequence[str],
        hypotheses: str | Sequence[str],
        batch_size: int = 256,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = False,
        device: str | None = None,
    ):
        """Logits over (entailment, neutral, contradiction): (3,) for one pair of strings, (n, 3) for lists."""
        if isinstance(premises, str) != isinstance(hypotheses, str):
            raise TypeError("classify_nli: give two strings or two lists")
        left, single = self._texts(premises, device)
        right, _ = self._texts(hypotheses, None)
        if len(left) != len(right):
            raise ValueError(f"classify_nli: {len(left)} premises but {len(right)} hypotheses")
        head = self.model.heads[self.model.task_of_head("nli")]
        both = self._embed(left + right, batch_size, True, show_progress_bar, "classify")  # (2n, dim)
        logits = head(both[: len(left)], both[len(left) :])  # (n, 3)
        return self._output(logits, single, convert_to_tensor)


def load(path: str | Path) -> SentenceEncoder:
    """Load a checkpoint folder without Ray: `load(p).encode(["a sentence"])`; `p` local or a URI
    (`load("s3://bucket/run/ray_results/.../checkpoint-3000")`, read once into a local cache)."""
    files = read_model_files(path)  # its manifest's sizes and digests, naming `path`; its config and tokenizer
    loaded = model_from_files(files)
    return SentenceEncoder(loaded.model, loaded.tokenizer, loaded.meta, files.folder)
