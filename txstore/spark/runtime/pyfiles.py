"""Build the zip that ships txstore to executors with ``spark-submit --py-files``."""

from __future__ import annotations

import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent.parent  # txstore/


def build_py_files(output: Path) -> Path:
    """Write the txstore package (sources only) into ``output``; return its path.

    Entries are sorted and timestamps fixed, so the same sources give the same zip.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(PACKAGE_DIR.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                name = path.relative_to(PACKAGE_DIR.parent).as_posix()
                info = zipfile.ZipInfo(name, date_time=(2000, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())
    return output
