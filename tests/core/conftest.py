"""The core tests' fixtures: ``readers`` (tests/helpers/streams.py), the stream readers a test made."""

from __future__ import annotations

from tests.helpers.streams import readers

__all__ = ["readers"]
