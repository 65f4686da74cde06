"""Exactly-once sums of a numeric field of JSON messages, per message key: an example txstore job.

    spark-submit jobs/sum_field.py --topic payments --field amount --once

Each message value is a JSON object such as {"amount": 12.50, ...}. The job
adds ``amount`` per message key (and per topic) into ``txn_data``, exactly
once, with the same flags as count_topic (`--help` lists them). Values that
are not JSON objects with a numeric ``amount`` are not summed; how many
there were is kept per topic in a row of grain ``skipped``.

The whole job is the aggregate below plus one call: txstore plans the
offset ranges, runs them on Spark and commits each range's deltas together
with its offsets.
"""

import argparse
import json
import os
import sys
from decimal import Decimal

try:
    import txstore  # noqa: F401  (installed, or shipped with --py-files)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from txstore import TOPIC_TOTAL, ResultKey, add_metrics, by_key, decode_key, run_job_main

SKIPPED = ResultKey("skipped")


def sum_field(field):
    """An aggregate: for one offset range, the sum of ``field`` per key, the topic sum, the skipped count."""

    def aggregate(offset_range, batches):
        deltas = {}
        skipped = 0
        for batch in batches:
            for message in batch:
                try:
                    amount = json.loads(message.value(), parse_float=Decimal)[field]
                except (TypeError, ValueError, KeyError, IndexError):
                    amount = None
                if isinstance(amount, bool) or not isinstance(amount, (int, Decimal)):
                    skipped += 1
                    continue
                row = by_key(decode_key(message.key()))
                # add_metrics, not +: Decimal's + rounds to 28 significant digits
                deltas[row] = add_metrics(deltas.get(row, 0), amount)
                deltas[TOPIC_TOTAL] = add_metrics(deltas.get(TOPIC_TOTAL, 0), amount)
        if skipped:
            deltas[SKIPPED] = skipped
        return deltas

    return aggregate


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--field", required=True, help="the JSON field to sum, e.g. amount")


if __name__ == "__main__":
    sys.exit(
        run_job_main(
            None,
            prog="sum_field",
            description="Sum a numeric JSON field per message key into PostgreSQL, exactly once.",
            default_job="sum_field",
            add_options=add_options,
            make_aggregate=lambda args: sum_field(args.field),
        )
    )
