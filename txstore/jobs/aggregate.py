"""The results-table job as a file for spark-submit: ``spark-submit "$(txstore job-file aggregate)" ...``.

The same job as ``python -m txstore.aggregate`` (:mod:`txstore.aggregate`); ``--help`` lists
every flag.
"""

import sys

from txstore.aggregate import main

if __name__ == "__main__":
    sys.exit(main())
