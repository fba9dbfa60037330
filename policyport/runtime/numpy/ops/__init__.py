"""ONNX operators of the numpy backend, one small function per op and semantic version.

Importing this package registers every op; :mod:`..registry` does it on first use.
"""

from . import (  # noqa: F401
    activation, conv, elementwise, linalg, logic, normalization, pool, recurrent, reduce, sampling, special, tensor,
)
