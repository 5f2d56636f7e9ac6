"""The docs' numbers for the Lease ``labels``/``sdk`` bounds are the gateway's own.

security.md's bounds table and protocol.md section 11 once said 64 entries, keys up to
128 bytes and values up to 1024 bytes while the gateway took 32, 1..64 and 256 (as
protocol.md 3.1 and configuration.md said): a fleet sized from the tables got
INVALID_ARGUMENT at Lease. Every place is read here and compared with the constants the
gateway enforces, so they cannot drift apart again. A check that the constants are the
ones enforced is in test_lease_bounds_are_enforced_as_documented.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dtq_gateway.domain.validation import MAX_SDK_BYTES, check_worker_strings
from dtq_gateway.errors import InvalidArgument
from dtq_gateway.rpc.broker_servicer import (
    MAX_LABEL_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    check_labels,
)
from dtq_proto import dtq_pb2 as pb

DOCS = Path(__file__).parents[2] / "docs"
ENFORCED = {"entries": MAX_LABELS, "key_max": MAX_LABEL_KEY_BYTES,
            "value_max": MAX_LABEL_VALUE_BYTES, "sdk": MAX_SDK_BYTES}


def _row(doc: str, starts: str) -> str:
    rows = [line for line in (DOCS / doc).read_text().splitlines() if line.startswith(starts)]
    assert len(rows) == 1, f"{doc}: expected one row starting {starts!r}, got {rows}"
    return rows[0]


def _table_numbers(doc: str, starts: str) -> dict[str, int]:
    row = _row(doc, starts)
    m = re.search(r"(\d+) entries, keys 1\.\.(\d+) bytes, values ≤ (\d+) bytes / (\d+) bytes",
                  row)
    assert m, f"{doc}: the labels/sdk row no longer says entries/keys/values/sdk: {row}"
    return dict(zip(("entries", "key_max", "value_max", "sdk"), map(int, m.groups())))


def test_security_bounds_table_matches_the_gateway():
    assert _table_numbers("security.md", "| Lease `labels` / `sdk` |") == ENFORCED


def test_protocol_section_11_matches_the_gateway():
    assert _table_numbers("protocol.md", "| `labels` / `sdk` (Lease) |") == ENFORCED


def test_protocol_section_3_1_matches_the_gateway():
    row = _row("protocol.md", "| `hostname`, `labels`, `sdk` |")
    m = re.search(r"at most (\d+) entries, keys of 1\.\.(\d+) and values of at most (\d+)", row)
    assert m, row
    assert tuple(map(int, m.groups())) == (MAX_LABELS, MAX_LABEL_KEY_BYTES,
                                           MAX_LABEL_VALUE_BYTES)


def test_configuration_doc_matches_the_gateway():
    row = _row("configuration.md", "| | `Worker(labels=)` |")
    m = re.search(r"at most (\d+); keys 1\.\.(\d+) bytes, values up to (\d+) bytes", row)
    assert m, row
    assert tuple(map(int, m.groups())) == (MAX_LABELS, MAX_LABEL_KEY_BYTES,
                                           MAX_LABEL_VALUE_BYTES)


@pytest.mark.parametrize("labels, ok", [
    ({str(i): "" for i in range(MAX_LABELS)}, True),
    ({str(i): "" for i in range(MAX_LABELS + 1)}, False),
    ({"k" * MAX_LABEL_KEY_BYTES: "v" * MAX_LABEL_VALUE_BYTES}, True),
    ({"k" * (MAX_LABEL_KEY_BYTES + 1): ""}, False),
    ({"": "v"}, False),
    ({"k": "v" * (MAX_LABEL_VALUE_BYTES + 1)}, False),
])
def test_lease_bounds_are_enforced_as_documented(labels, ok):
    req = pb.LeaseRequest(labels=labels, sdk="s" * MAX_SDK_BYTES)
    if ok:
        check_labels(req.labels)
        check_worker_strings(req)
    else:
        with pytest.raises(InvalidArgument) as err:
            check_labels(req.labels)
        assert err.value.field == "labels"
    with pytest.raises(InvalidArgument) as err:
        check_worker_strings(pb.LeaseRequest(sdk="s" * (MAX_SDK_BYTES + 1)))
    assert err.value.field == "sdk"
