"""Spark SQL over each batch of Kafka messages, merged exactly once into your own PostgreSQL table.

    spark-submit jobs/aggregate.py --topic orders --table sales --key country --merge revenue=sum --sql "SELECT ..."

Settings: --bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS, --database-url /
TXSTORE_DATABASE_URL; `--help` lists every flag.
"""

import os
import sys

try:
    import txstore  # noqa: F401  (installed, or shipped with --py-files)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from txstore.aggregate import main

if __name__ == "__main__":
    sys.exit(main())
