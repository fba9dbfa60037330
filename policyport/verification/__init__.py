"""Verification: the comparison rule (:mod:`.compare`), running the backends and the source on
the same observations and comparing every tensor (:mod:`.verify`), and what a model holds
(:mod:`.summary`, for ``inspect``)."""
