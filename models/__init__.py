"""Pure-torch models: encoders, task heads, losses and checkpoints (no Ray, no MLflow).

A trained encoder is `convsts.models.sentence_encoder.load(path)` (a `SentenceEncoder`);
`convsts.models.config` holds the dataclasses a run config keeps and loads no torch, so a command
that only reads a config, such as `convsts prepare`, starts without it."""
