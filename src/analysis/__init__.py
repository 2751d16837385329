"""Prefix Cache Lab: measure and explain prefix caching in LLM serving.

Importing `analysis` stays light: vLLM and torch are imported lazily by the engines.
"""

__version__ = "0.1.0"
