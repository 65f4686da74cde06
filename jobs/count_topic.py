"""Exactly-once message counts per Kafka topic in PostgreSQL.

    spark-submit jobs/count_topic.py --topic events --once
    python jobs/count_topic.py --topic events --interval 10

Settings: --bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS, --database-url /
TXSTORE_DATABASE_URL; `--help` lists every flag.
"""

import os
import sys

try:
    import txstore  # noqa: F401  (installed, or shipped with --py-files)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from txstore.count_topic import main

if __name__ == "__main__":
    sys.exit(main())
