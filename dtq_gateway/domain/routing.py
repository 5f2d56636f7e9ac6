"""Validation of the fairness fields of EnqueueRequest (docs/fairness.md): the
concurrency key and the required labels."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping

from dtq_gateway.errors import InvalidArgument

#: Most bytes of EnqueueRequest.concurrency_key (UTF-8).
MAX_CONCURRENCY_KEY_BYTES = 128


def check_concurrency_key(ckey: str, field: str = "concurrency_key") -> str:
    """Return ``ckey`` ("" = none) if it is at most 128 bytes of UTF-8 without control
    characters, else raise InvalidArgument naming ``field``."""
    if len(ckey.encode()) > MAX_CONCURRENCY_KEY_BYTES:
        raise InvalidArgument(f"{field}: at most {MAX_CONCURRENCY_KEY_BYTES} bytes",
                              field=field)
    if any(unicodedata.category(c) == "Cc" for c in ckey):  # C0, DEL and C1
        raise InvalidArgument(f"{field}: must not contain control characters", field=field)
    return ckey


#: Bounds of EnqueueRequest.required_labels (those of LeaseRequest.labels): pairs, key
#: and value length in UTF-8 bytes.
MAX_REQUIRED_LABELS = 32
MAX_LABEL_KEY_BYTES = 64
MAX_LABEL_VALUE_BYTES = 256


def required_labels_json(labels: Mapping[str, str], field: str = "required_labels") -> str:
    """``labels`` as compact JSON with sorted keys ("" when empty), after checking at most
    32 pairs, keys of 1..64 and values of at most 256 UTF-8 bytes.

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not labels:
        return ""
    if len(labels) > MAX_REQUIRED_LABELS:
        raise InvalidArgument(f"{field}: at most {MAX_REQUIRED_LABELS} entries", field=field)
    for k, v in labels.items():
        if not 1 <= len(k.encode()) <= MAX_LABEL_KEY_BYTES:
            raise InvalidArgument(f"{field}: keys must be 1..{MAX_LABEL_KEY_BYTES} bytes",
                                  field=field)
        if len(v.encode()) > MAX_LABEL_VALUE_BYTES:
            raise InvalidArgument(f"{field}: value of {k!r} over {MAX_LABEL_VALUE_BYTES} bytes",
                                  field=field)
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
