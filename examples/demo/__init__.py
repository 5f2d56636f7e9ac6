"""The dtq demo: every ``.py`` file of the standard library through a real dtq system.

``python -m examples.demo`` (or ``make demo``) starts a gateway (with an embedded
redis-server unless ``DTQ_REDIS_URL`` is set), two ``dtq-pyworker`` processes (plus
a Node worker when ``examples/node-worker`` is installed), enqueues one task per
stdlib file plus a few deliberately failing ones, shows a progress bar, prints a
summary and shuts everything down cleanly.

Modules:
    handlers: the Worker and its task handlers (``dtq-pyworker examples.demo.handlers:worker``).
    textstats: the pure line/word/sha256 statistics of one file.
    producer: builds and enqueues the demo tasks.
    tracker: follows tasks to their terminal state (events, GetTask polling).
    summary: turns the final task records into the summary.
    processes: starts and stops the gateway and worker processes.
"""
