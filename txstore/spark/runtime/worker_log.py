"""txstore's INFO lines from the Python workers that run the stream source and sink.

Spark runs a Python data source's planning and commits (``latestOffset``, ``commit``, the
sink's commit) in Python workers it forks, where nobody configures :mod:`logging`: a record
below WARNING then goes nowhere (Python's last-resort handler prints warnings only). The lines
an operator needs at those moments are INFO: a partition that starts at its earliest offset,
a replayed micro-batch recognised as already committed, a job whose offsets now follow Spark's
checkpoint. :func:`worker_info_to_stderr` gives the ``txstore`` logger one stderr handler at
INFO in such a process, once, and only where no handler is configured (not in a job's driver,
not under pytest): the worker's stderr is the driver's console or log.
"""

from __future__ import annotations

import logging
import sys

_added = False


def worker_info_to_stderr() -> None:
    """Send ``txstore`` INFO lines to stderr in a process whose logging nobody configured."""
    global _added
    logger = logging.getLogger("txstore")
    if _added or logger.handlers or logging.getLogger().handlers:
        return
    _added = True
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("txstore: %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
