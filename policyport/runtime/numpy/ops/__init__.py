"""ONNX operators of the numpy backend, one small function per op and semantic version.

Importing this package registers every op; :mod:`..registry` does it on first use.
"""

from . import activation, elementwise, linalg, logic, normalization, reduce, special, tensor  # noqa: F401
