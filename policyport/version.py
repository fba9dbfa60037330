"""policyport's version (a packed folder's runtime records it)."""

__version__ = "0.1.0"
