"""Reame: LLM inference on cheap CPUs, on llama.cpp. Never compute the same thing twice."""

__version__ = "0.1.0"
