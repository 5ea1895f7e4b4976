"""Hard negatives for a prepared folder's Reddit training pairs (the library behind `convsts mine-negatives`).

Encodes the contexts and the responses of the training pairs with a checkpoint, on the driver or
on a pool of Ray Data actors (`EncodePool`), keeps the embeddings chunk by chunk in a folder keyed
by the checkpoint's weights and the pairs' text (`EmbeddingCache`: a killed run resumes, another
model's embeddings are refused), and writes a complete prepared folder whose reddit/train carries
a `negative` column (`mine_prepared`; the scoring and the draw are datasets/negatives.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from convsts.datasets.negatives import MiningConfig, mine
from convsts.io import redaction, storage, tables
from convsts.io.errors import BadInputError
from convsts.models.checkpoint import embeddings_digest
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.ray_start import ensure_ray
from convsts.ray_jobs.tasks.prepared_folder import copy_prepared, verify_prepared, write_manifest, write_train_frame
from convsts.ray_jobs.tasks.reddit import NEGATIVE
from convsts.ray_jobs.tasks.reddit import TASK as REDDIT

EMBEDDING_CHUNK = 4096  # sentences per cached file: a killed run loses at most one chunk of encoding


def embeddings_key(checkpoint: str, frame, chunk: int) -> dict[str, str]:
    """What cached embeddings are of: the checkpoint's weights and tokenizer, the pairs' text, the chunking."""
    texts = hashlib.sha1()
    for context, response in zip(frame["context"], frame["response"]):
        texts.update(f"{context}\x00{response}\x00".encode())
    return {
        "checkpoint_weights": embeddings_digest(checkpoint),
        "pairs_text": texts.hexdigest(),
        "pairs": str(len(frame)),
        "chunk": str(chunk),
    }


class EmbeddingCache:
    """Encoded sentences in a folder, one .npy file per chunk of `chunk` rows and side, beside the
    key (embeddings_key) they were made under. Each file is written whole (storage.write_bytes),
    so a killed run leaves only whole chunks."""

    def __init__(self, folder: str, key: dict[str, str], chunk: int):
        self.folder, self.chunk, self.reused, self.encoded = folder, chunk, 0, 0
        if storage.is_file(folder):
            raise BadInputError(
                f"{redaction.redact(folder)}: a file, not a folder; give --embeddings a folder (new or "
                f"made by an earlier run)"
            )
        key_path = storage.join(folder, "key.json")
        if storage.is_file(key_path):
            held = json.loads(storage.read_text(key_path))
            differ = sorted(k for k in set(held) | set(key) if held.get(k) != key.get(k))
            if differ:
                raise BadInputError(
                    f"{redaction.redact(key_path)}: these embeddings are of another {' and '.join(differ)} than this run's "
                    f"(held {[held.get(k) for k in differ]}, this run {[key.get(k) for k in differ]}); "
                    f"give --embeddings a new folder"
                )
        else:
            if not storage.is_uri(folder):
                Path(folder).mkdir(parents=True, exist_ok=True)
            storage.write_text(key_path, json.dumps(key, indent=1, sort_keys=True))

    def _path(self, side: str, index: int) -> str:
        return storage.join(self.folder, f"{side}-{index:05d}.npy")

    def held(self, side: str, index: int) -> torch.Tensor | None:
        """(c, D) float32: chunk `index` of `side` where an earlier run wrote it, else None."""
        path = self._path(side, index)
        if not storage.is_file(path):
            return None
        with storage.open_binary(path) as fh:
            self.reused += 1
            return torch.from_numpy(np.load(io.BytesIO(fh.read())))

    def keep(self, side: str, index: int, emb: torch.Tensor) -> None:
        storage.write_bytes(self._path(side, index), npy_bytes(emb))
        self.encoded += 1


def npy_bytes(emb: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, emb.cpu().float().numpy())
    return buffer.getvalue()


def encode_side(encoder, side: str, texts: Sequence[str], batch_size: int) -> torch.Tensor:
    """(n, D) float32 on the CPU: contexts through `encode`, responses through `encode_responses`
    (the two sides of the Reddit score), on the process's GPU where it has one."""
    method = encoder.encode_responses if side == "response" else encoder.encode
    return method(list(texts), batch_size=batch_size, convert_to_tensor=True, device="auto").cpu().float()


Chunk = tuple[str, int, list[str]]  # (side, index, texts)


def encoded_here(encoder, chunks: Sequence[Chunk], batch_size: int) -> Iterator[tuple[str, int, torch.Tensor]]:
    for side, index, texts in chunks:
        yield side, index, encode_side(encoder, side, texts, batch_size)


class ChunkEncoder:
    """A Ray Data actor holding one copy of the model: encodes whole chunks (on the actor's GPU
    when it was given one) and returns each as .npy bytes."""

    def __init__(self, encoder: list, batch_size: int, threads: int):
        import ray

        torch.set_num_threads(threads)  # the CPUs this actor reserved, not the whole node's
        self.encoder = ray.get(encoder[0])  # [ObjectRef]: the model, put once by the driver
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = [
            npy_bytes(encode_side(self.encoder, str(side), list(texts), self.batch_size))
            for side, texts in zip(batch["side"], batch["texts"])
        ]
        return {"side": batch["side"], "index": batch["index"], "embeddings": np.array(out, dtype=object)}


@dataclasses.dataclass
class EncodePool:
    """Where mine-negatives encodes: workers=0 in this process; otherwise that many Ray Data actors,
    each with its own copy of the model and cpus (and gpus) of its own, one chunk at a time."""

    workers: int = 0
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    def validate(self) -> EncodePool:
        if self.workers < 0 or self.cpus_per_worker <= 0 or self.gpus_per_worker < 0:
            raise ValueError(
                f"need --workers >= 0, --cpus-per-worker > 0 and --gpus-per-worker >= 0, got "
                f"{self.workers}, {self.cpus_per_worker:g}, {self.gpus_per_worker:g}"
            )
        if self.gpus_per_worker and not self.workers:
            raise ValueError(
                "--gpus-per-worker is for a pool: give --workers N too (without a pool the command "
                "encodes on this machine's GPU when it has one)"
            )
        return self

    def encoded(self, encoder, chunks: Sequence[Chunk], batch_size: int) -> Iterator[tuple[str, int, torch.Tensor]]:
        """(side, index, (c, D) embeddings) for each chunk, in the order they finish."""
        if not self.workers or not chunks:
            yield from encoded_here(encoder, chunks, batch_size)
            return
        import ray
        import ray.data

        ensure_ray()
        rows = [{"side": side, "index": index, "texts": texts} for side, index, texts in chunks]
        done = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            ChunkEncoder,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=self.workers),
            num_cpus=self.cpus_per_worker,
            num_gpus=self.gpus_per_worker or None,
            # The model travels by reference inside a list: each actor (and a restarted one) gets it
            # from the object store, and the driver's reference keeps it there until the pool is done.
            fn_constructor_args=([ray.put(encoder)], batch_size, max(1, int(self.cpus_per_worker))),
        )
        for row in done.iter_rows():
            yield str(row["side"]), int(row["index"]), torch.from_numpy(np.load(io.BytesIO(row["embeddings"])))


def embed_pairs(
    encoder, frame, chunk: int, batch_size: int, cache: EmbeddingCache | None, pool: EncodePool
) -> dict[str, torch.Tensor]:
    """{"context": (n, D), "response": (n, D)}: the pairs' two sides, chunk by chunk, read from the
    cache where it holds a chunk, the rest encoded by `pool` (and written to the cache as each
    chunk finishes, so a killed run keeps whole chunks)."""
    parts: dict[str, dict[int, torch.Tensor]] = {"context": {}, "response": {}}
    todo: list[Chunk] = []
    for side, held in parts.items():
        texts = frame[side].tolist()
        for index, start in enumerate(range(0, len(texts), chunk)):
            emb = cache.held(side, index) if cache else None
            if emb is None:
                todo.append((side, index, texts[start : start + chunk]))
            else:
                held[index] = emb
    for count, (side, index, emb) in enumerate(pool.encoded(encoder, todo, batch_size), start=1):
        if cache:
            cache.keep(side, index, emb)
        parts[side][index] = emb
        log.info("mine-negatives: %d of %d chunks encoded (%s %d)", count, len(todo), side, index + 1)
    return {side: torch.cat([held[i] for i in sorted(held)]) for side, held in parts.items()}  # (n, D) each


def mine_prepared(
    checkpoint: str,
    prepared: str,
    out: str,
    mining: MiningConfig,
    pairs: int,
    batch_size: int,
    embeddings: str = "",
    chunk: int = EMBEDDING_CHUNK,
    pool: EncodePool | None = None,
):
    """The work of the command; returns OUT's Reddit manifest."""

    mining.validate()
    pool = (pool or EncodePool()).validate()
    if pairs < 0:
        raise ValueError(f"--pairs: must be >= 0 (0 = all), got {pairs}")
    if storage.has_entries(out):
        raise FileExistsError(f"{out} is not empty; choose a new --out folder")
    started = time.time()
    encoder = load(checkpoint)  # a wrong checkpoint fails before the data is read
    manifest = verify_prepared(REDDIT, prepared)
    frame, total = sampled_training_pairs(prepared, pairs, mining)
    log.info("mine-negatives: encoding %d contexts and %d responses with %s", len(frame), len(frame), checkpoint)
    cache = EmbeddingCache(embeddings, embeddings_key(checkpoint, frame, chunk), chunk) if embeddings else None
    embedded = embed_pairs(encoder, frame, chunk, batch_size, cache, pool)
    if cache and cache.reused:
        log.info(
            "mine-negatives: %d of %d chunks read from %s, %d encoded",
            cache.reused,
            cache.reused + cache.encoded,
            redaction.redact(embeddings),
            cache.encoded,
        )
    context, response = embedded["context"], embedded["response"]  # (n, D) each
    mined, without = with_negatives(frame, mine(context, response, mining), mining)

    negatives = {
        "checkpoint": checkpoint,
        "from": prepared,
        "of_train_pairs": total,
        "sampled_pairs": len(frame),
        "mined_pairs": len(mined),
        "without_negative": without,
        **{k: v for k, v in dataclasses.asdict(mining).items() if k != "chunk"},
        "embeddings": redaction.redact(embeddings),
        "embedding_chunks_reused": cache.reused if cache else 0,
        "encode_workers": pool.workers,
        "seconds": round(time.time() - started, 1),
    }
    return write_mined_folder(prepared, out, mined, manifest, negatives)


def with_negatives(frame, chosen, mining: MiningConfig):
    """(the pairs that got a negative, with the `negative` column; how many got none) for the
    mined candidates `chosen` (n,) (-1: none)."""
    found = chosen >= 0
    frame[NEGATIVE] = frame["response"].to_numpy()[np.where(found, chosen, 0)]
    mined = frame[found].reset_index(drop=True)
    without = int((~found).sum())
    log.info(
        "mine-negatives: %d of %d pairs got a negative; %d had no candidate in ranks [%d, %d)%s (left out)",
        len(mined),
        len(frame),
        without,
        mining.range_min,
        mining.range_max,
        "" if mining.margin is None else f" scoring {mining.margin:g} below their response",
    )
    return mined, without


def sampled_training_pairs(prepared: str, pairs: int, mining: MiningConfig):
    """(the training pairs to mine: all, or a seeded sample of `pairs`; the number of training pairs)."""
    frame = tables.read_parquet_table(REDDIT.train_path(prepared)).to_pandas()
    # Shard order from Ray Data is not fixed: sort so that the seeded sample is reproducible.
    frame = frame.sort_values(list(frame.columns), kind="stable").reset_index(drop=True)
    total = len(frame)
    if pairs and pairs < total:
        keep = np.sort(np.random.default_rng(mining.seed).choice(total, size=pairs, replace=False))
        frame = frame.iloc[keep].reset_index(drop=True)
    if len(frame) <= mining.range_min:
        raise BadInputError(
            f"{REDDIT.train_path(prepared)}: {len(frame)} pairs to mine, need more than "
            f"--range-min ({mining.range_min})"
        )
    return frame, total


def write_mined_folder(prepared: str, out: str, mined, manifest: dict, negatives: dict) -> dict:
    """OUT as a complete prepared folder: every other task's folder (its manifest's shard times
    those of the copies: copy_prepared) and the Reddit test split copied as they are, reddit/train
    the mined pairs; returns OUT's Reddit manifest."""
    for entry in storage.entry_names(prepared):  # every other task's folder (custom tasks too), as it is
        if entry != REDDIT.name:
            copy_prepared(storage.join(prepared, entry), storage.join(out, entry))
    reddit_out = REDDIT.prepared_dir(out)
    storage.copy_tree(storage.join(REDDIT.prepared_dir(prepared), "test"), storage.join(reddit_out, "test"))
    rows_per_shard = max([shard["rows"] for shard in manifest["shards"]["train"]], default=1)  # as prepared
    shards = {"train": write_train_frame(mined, reddit_out, rows_per_shard), "test": manifest["shards"]["test"]}
    manifest = {**manifest, "shards": shards}  # the test split's shards copied as they were, byte for byte
    manifest.update(train_pairs=len(mined), pairs=len(mined) + manifest.get("test_pairs", 0), negatives=negatives)
    return write_manifest(REDDIT, reddit_out, manifest)
