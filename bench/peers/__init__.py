"""Peer task queues measured side by side with dtq.

Modules in this package except :mod:`bench.peers.orchestrate` run inside
``bench/.peers-venv`` (their own dependencies, never dtq's), one subprocess per
peer; :mod:`bench.peers.orchestrate` runs in dtq's venv and drives them.
"""
