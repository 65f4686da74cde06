"""txstore's INFO lines reach stderr from a Python worker whose logging nobody configured (the
stream source's and sink's planner workers), and are not doubled where logging is configured."""

from __future__ import annotations

import subprocess
import sys

SAY = (
    "import logging\n"
    "{setup}"
    "from txstore.spark.runtime.worker_log import worker_info_to_stderr\n"
    "worker_info_to_stderr()\n"
    "worker_info_to_stderr()\n"
    "logging.getLogger('txstore.spark.stream.stream_sink').info('job j: micro-batch 3 already committed; skipped')\n"
    "logging.getLogger('txstore.spark.stream.stream_sink').debug('not this one')\n"
)


def _stderr(setup: str = "") -> str:
    done = subprocess.run(
        [sys.executable, "-c", SAY.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr


def test_a_worker_without_logging_prints_txstore_s_info_lines_once_and_not_its_debug() -> None:
    assert _stderr() == "txstore: job j: micro-batch 3 already committed; skipped\n"


def test_a_process_whose_logging_is_configured_keeps_its_own_handlers_and_level() -> None:
    configured = _stderr("logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n")
    assert configured == "INFO job j: micro-batch 3 already committed; skipped\n"
    quiet = _stderr("logging.basicConfig(level=logging.WARNING)\n")
    assert quiet == ""
