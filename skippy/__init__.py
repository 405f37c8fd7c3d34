"""skippy: keep a downstream patch queue on top of upstream llama.cpp."""

__version__ = "0.1.0"
