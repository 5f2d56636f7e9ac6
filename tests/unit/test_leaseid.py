"""Lease ids round-trip and reject anything malformed."""

from __future__ import annotations

import pytest

from dtq_gateway import leaseid
from dtq_gateway.errors import InvalidArgument

LEASE = leaseid.Lease("a" * 32, "emails", 7, "1700000000000-3", 2, "host-1:w@x", "b" * 64)


def test_roundtrip():
    assert leaseid.decode(LEASE.encode()) == LEASE
    no_idem = leaseid.Lease("a" * 32, "q", 0, "1-0", 1, "w", "")
    assert leaseid.decode(no_idem.encode()) == no_idem
    assert LEASE.stream == "dtq:stream:{emails}:p7"


@pytest.mark.parametrize("bad", [
    "", "garbage", LEASE.encode().replace("1|", "2|", 1), LEASE.encode() + "|x",
    LEASE.encode().replace("|7|", "|10|"), LEASE.encode().replace("emails", "e mails"),
    LEASE.encode().replace("1700000000000-3", "1700000000000"), "1|" + "|" * 7,
    "x" * 1000,
    # only ASCII digits, and no trailing newline ($ would accept one)
    LEASE.encode().replace("|2|", "|\u00b2|"), LEASE.encode().replace("|2|", "|\u0662|"),
    LEASE.encode().replace("1700000000000-3", "1700000000000-\u0663"),
    LEASE.encode().replace("emails", "emails\n"), LEASE.encode() + "\n",
])
def test_malformed_ids_are_invalid_argument(bad):
    with pytest.raises(InvalidArgument) as err:
        leaseid.decode(bad, field="items[0].lease_id")
    assert err.value.field == "items[0].lease_id"
    assert err.value.reason == "MALFORMED_LEASE"
