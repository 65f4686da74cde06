"""count_topic as a file for spark-submit: ``spark-submit "$(txstore job-file count_topic)" --topic T``.

The same job as ``python -m txstore.count_topic`` (:mod:`txstore.count_topic`); ``--help`` lists
every flag.
"""

import sys

from txstore.count_topic import main

if __name__ == "__main__":
    sys.exit(main())
