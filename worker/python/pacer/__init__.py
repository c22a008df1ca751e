"""Pacer: an elastic, straggler-tolerant parameter server.

``pacer._core`` is the training runtime (C++, pybind11); ``pacer.torch``
trains a PyTorch model through it from the user's own loop.
"""

from . import _core  # noqa: F401

__all__ = ["_core"]
