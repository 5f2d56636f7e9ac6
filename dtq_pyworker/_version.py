"""Version of dtq_pyworker and the ``sdk`` string sent in LeaseRequest."""

__version__ = "0.1.0"
SDK = f"dtq-pyworker/{__version__}"
