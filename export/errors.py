"""The two ways an export ends without publishing."""
from __future__ import annotations


class ExportError(ValueError):
    """Bad input (checkpoint, task, name, version, data file): one line that names the field; CLI exit 2."""


class ParityFailure(RuntimeError):
    """The parity gate found a breach; `report` holds every check, nothing was published."""

    def __init__(self, message: str, report: dict) -> None:
        super().__init__(message)
        self.report = report
