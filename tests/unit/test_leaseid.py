"""Lease ids round-trip, reject anything malformed, and verify only as issued."""

from __future__ import annotations

import pytest

from dtq_gateway.errors import InvalidArgument, PermissionDenied
from dtq_gateway.leasing import leaseid

RING = leaseid.Keyring([b"k" * 32])
OWNER = leaseid.owner_tag("token:alice")
LEASE = leaseid.Lease("a" * 32, "emails", 7, "1700000000000-3", 2, "host-1:w@x", "b" * 64,
                      OWNER)
WIRE = LEASE.encode(RING)


def test_roundtrip():
    assert leaseid.decode(WIRE, RING) == LEASE
    no_idem = leaseid.Lease("a" * 32, "q", 0, "1-0", 1, "w", "", OWNER)
    assert leaseid.decode(no_idem.encode(RING), RING) == no_idem
    assert leaseid.decode(WIRE, RING, caller="token:alice") == LEASE


@pytest.mark.parametrize("bad", [
    "", "garbage", WIRE.replace("2|", "1|", 1), WIRE + "|x",
    WIRE.replace("|7|", "|10|"), WIRE.replace("emails", "e mails"),
    WIRE.replace("1700000000000-3", "1700000000000"), "2|" + "|" * 9,
    "x" * 1000,
    # only ASCII digits, and no trailing newline ($ would accept one)
    WIRE.replace("|2|", "|\u00b2|"), WIRE.replace("|2|", "|\u0662|"),
    WIRE.replace("1700000000000-3", "1700000000000-\u0663"),
    WIRE.replace("emails", "emails\n"), WIRE + "\n",
    WIRE.rpartition("|")[0],  # no MAC
])
def test_malformed_ids_are_invalid_argument(bad):
    with pytest.raises(InvalidArgument) as err:
        leaseid.decode(bad, RING, field="items[0].lease_id")
    assert err.value.field == "items[0].lease_id"
    assert err.value.reason == "MALFORMED_LEASE"


@pytest.mark.parametrize("edited", [
    WIRE.replace("|emails|", "|emailz|"), WIRE.replace("|7|", "|6|"),
    WIRE.replace("|host-1:w@x|", "|host-2:w@x|"), WIRE.replace("|2|", "|3|"),
    WIRE.replace(OWNER, leaseid.owner_tag("token:mallory")),
    WIRE[:-1] + ("A" if WIRE[-1] != "A" else "B"),
])
def test_edited_ids_do_not_verify(edited):
    with pytest.raises(PermissionDenied) as err:
        leaseid.decode(edited, RING)
    assert err.value.reason == "LEASE_SIGNATURE"


def test_another_identity_is_denied():
    with pytest.raises(PermissionDenied) as err:
        leaseid.decode(WIRE, RING, caller="token:mallory")
    assert err.value.reason == "LEASE_NOT_OWNED"


def test_rotation_signs_with_first_and_accepts_any():
    rotated = leaseid.Keyring([b"n" * 32, b"k" * 32])
    assert leaseid.decode(WIRE, rotated) == LEASE  # issued before the rotation
    fresh = LEASE.encode(rotated)
    assert fresh != WIRE
    with pytest.raises(PermissionDenied):  # the old secret alone does not know the new
        leaseid.decode(fresh, RING)
    with pytest.raises(PermissionDenied):  # dropped secret: its ids no longer verify
        leaseid.decode(WIRE, leaseid.Keyring([b"n" * 32]))


def test_secret_list_parsing():
    assert leaseid.parse_secrets(" a" * 1 + "x" * 20 + ", ,yyyyyyyyyyyyyyyyyy") == [
        b"a" + b"x" * 20, b"y" * 18]
    with pytest.raises(ValueError) as err:
        leaseid.parse_secrets("short-secret")
    assert "short-secret" not in str(err.value)
