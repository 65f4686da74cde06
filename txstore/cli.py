"""The ``txstore`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="txstore", description="Exactly-once Kafka aggregation with Spark.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser(
        "count-topic", help="run the count_topic job (same flags as jobs/count_topic.py)", add_help=False
    )
    demo = commands.add_parser("demo", help="run count_topic end to end on an embedded broker and database")
    demo.add_argument("--messages", type=int, default=20_000)
    demo.add_argument("--partitions", type=int, default=4)
    pyfiles = commands.add_parser("py-files", help="build the zip for spark-submit --py-files")
    pyfiles.add_argument("--output", type=Path, default=Path("txstore-pyfiles.zip"))
    commands.add_parser("mock-kafka", help="serve a Kafka-protocol mock broker until stopped", add_help=False)

    if argv and argv[0] == "count-topic":
        from txstore.count_topic import main as count_topic

        return count_topic(argv[1:])
    if argv and argv[0] == "mock-kafka":
        from txstore.testing.mock_kafka import main as mock_kafka

        return mock_kafka(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "demo":
        from txstore.demo import run_demo
        from txstore.runner import configure_logging

        configure_logging()
        return run_demo(args.messages, args.partitions)
    if args.command == "py-files":
        from txstore.pyfiles import build_py_files

        print(build_py_files(args.output))
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
