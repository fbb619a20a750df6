"""The one error type of bad training data (user files, downloads, task settings)."""
from __future__ import annotations


class DataError(ValueError):
    """Bad user data; the message is one line naming the file, line and field."""
