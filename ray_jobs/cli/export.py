"""`convsts export`: a checkpoint's encoder in a format other libraries load.

convsts export --checkpoint C --format onnx --out DIR
    DIR/model.onnx and DIR/tokenizer.json: inputs are `tokenizer.encode(texts)`'s int64 arrays
    (DAN: words, bigrams; Transformer, pretrained: ids), output `sentence_embedding` (batch, dim),
    unit length; `convsts.models.export.OnnxEncoder(DIR).encode(texts)` runs it with onnxruntime.
convsts export --checkpoint C --format sentence-transformers --out DIR
    (model.encoder=pretrained) `SentenceTransformer(DIR).encode(texts)` gives the checkpoint's
    embeddings; models/export.py says what differs (text normalization).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from convsts.models.checkpoint import read_model_files
from convsts.ray_jobs.runtime.logs import log, setup_logging

FORMATS = {"onnx": "to_onnx", "sentence-transformers": "to_sentence_transformers"}  # convsts.models.export


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--format", required=True, choices=sorted(FORMATS))
    parser.add_argument("--out", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    read_model_files(args.checkpoint)  # a damaged or foreign folder is refused before the library loads
    from convsts.models import export

    out = getattr(export, FORMATS[args.format])(args.checkpoint, args.out)
    log.info("wrote %s (%s)", out, args.format)
    return 0
