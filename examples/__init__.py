"""Runnable dtq examples: the demo app (``python -m examples.demo``) and other-language workers."""
