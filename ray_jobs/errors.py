"""The run config's error type (a leaf module: everything may import it)."""


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


class TrackingError(RuntimeError):
    """MLflow did not take what a command had finished; its results are in --out already."""
