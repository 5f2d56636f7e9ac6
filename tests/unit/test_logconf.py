"""Gateway log formats: the text format keeps the ``extra`` fields the JSON one shows."""

from __future__ import annotations

import logging

import pytest

from dtq_gateway import logconf


@pytest.fixture
def text_format():
    """The formatter ``DTQ_LOG_FORMAT=text`` installs (root handlers restored after)."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    logconf.configure("INFO", "text")
    fmt = root.handlers[0].formatter
    root.handlers[:] = saved
    root.setLevel(level)
    return fmt


def record(msg: str, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("dtq_gateway.server", logging.INFO, __file__, 1, msg, (), None)
    rec.__dict__.update(extra)
    return rec


def test_text_format_appends_extra_fields_as_key_value(text_format):
    line = text_format.format(record("listening", address="127.0.0.1", port=50051,
                                         worker_id="w-1"))
    assert line.endswith("INFO dtq_gateway.server: listening address=127.0.0.1 port=50051 "
                         "worker_id=w-1")


def test_text_values_with_spaces_or_equals_are_quoted(text_format):
    line = text_format.format(record("stopped", reason="bad input", detail="a=b", empty=""))
    assert 'reason="bad input" detail="a=b" empty=""' in line


def test_text_format_without_extras_is_the_plain_line(text_format):
    assert text_format.format(record("hello")).endswith("dtq_gateway.server: hello")
