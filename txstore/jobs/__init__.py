"""The jobs as files, for ``spark-submit``, which runs a file, not a module.

An installed txstore (a wheel in a venv, a Docker image or a packed environment) has no
``jobs/`` folder of a checkout; these files are in the package instead:

    spark-submit --master spark://host:7077 "$(txstore job-file count_topic)" --topic events --once

Locally, ``python -m txstore.count_topic`` (or ``txstore count-topic``) runs the same job.
"""

from __future__ import annotations

from pathlib import Path

JOBS_DIR = Path(__file__).resolve().parent


def job_file(name: str) -> Path:
    """The path of the job ``name`` (``count_topic``, ``aggregate``) in the installed package."""
    path = JOBS_DIR / f"{name}.py"
    if name.startswith("_") or not path.is_file():
        raise ValueError(f"txstore ships no job {name!r}")
    return path
