"""Credentials in URIs and text: used, never written. `redact` turns the user-info part of a URI
(s3://KEY:SECRET@bucket, https://user:password@mlflow) and query parameters whose name says what
they hold (secret_key=, token=, X-Amz-Signature=, ...) into ***, in any text: log lines, error
lines, MLflow params and tags, manifests, configs."""

from __future__ import annotations

import re

# Credentials that users put in URIs: the user-info part (s3://KEY:SECRET@bucket,
# https://user:password@mlflow) and query parameters whose name says what they hold.
# As URL parsers split it: the authority ends at the first "/", "?" or "#", and the user-info is
# everything before its last "@" (a password may hold "@", ":" or quotes). A URI whose "//" a path
# library collapsed (s3:/KEY:SECRET@bucket) is matched too.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://|\b[A-Za-z][A-Za-z0-9+.-]+:/)(?P<userinfo>[^/?#\s]+)@")


_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_.-]*?)(?:key|secret|token|password|passwd|pwd|signature|sig|credential|auth)"
    r"[A-Za-z0-9_.-]*=)(?P<value>[^&#\s'\"]+?)(?=[&#\s'\"]|:\s|$)",
    re.IGNORECASE,
)  # a value ends before ": "


REDACTED = "***"


def redact(text: str) -> str:
    """`text` with every URI's user-info and credential-like query values replaced by ***
    (`s3://KEY:SECRET@b/p?secret_key=S&region=x` -> `s3://***@b/p?secret_key=***&region=x`)."""
    if not isinstance(text, str) or ("@" not in text and "=" not in text):
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    return _SECRET_PARAM.sub(lambda m: f"{m['name']}{REDACTED}", text)


def redact_tree(value):
    """`redact` applied to every string in nested dicts, lists and tuples (keys included)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_tree(k): redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_tree(v) for v in value)
    return value


def has_credentials(text: str) -> bool:
    return redact(text) != text


def strip_credentials(uri: str) -> str:
    """`uri` without its user-info and without credential-like query parameters."""
    uri = _USERINFO.sub(lambda m: m["scheme"], uri)
    stripped = _SECRET_PARAM.sub("", uri)
    if "?" not in stripped and "&" in stripped:
        stripped = stripped.replace("&", "?", 1)
    return stripped
