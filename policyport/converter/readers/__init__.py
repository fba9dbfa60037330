"""Readers shared by the sources: a restricted unpickler, a msgpack decoder and torch's zip
format, none of which runs code from a file."""
