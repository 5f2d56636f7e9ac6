"""dtq benchmark: floors (raw Redis, empty gRPC), dtq itself, and peer task queues.

Run ``python -m bench`` (or ``make bench``). Nothing here is imported by the
gateway or the worker, and nothing here runs in the test suite. This package's
``__init__`` stays import-free because peer scripts under ``bench.peers`` run in
a separate virtualenv that has none of dtq's dependencies.
"""
