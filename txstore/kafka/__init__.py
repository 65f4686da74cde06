"""The Kafka side: client settings, watermarks and time lookups, reading a range, topic IDs.

Owns the confluent-kafka client settings and admin calls (:mod:`~txstore.kafka.client`),
reading exactly one planned offset range and checking it read the planned log
(:mod:`~txstore.kafka.reader`, one consumer per configuration per process, reused), topic
IDs and the last message counted (:mod:`~txstore.kafka.topic_ids`), finding the message an
aggregate fails on by re-reading a range (:mod:`~txstore.kafka.bad_messages`) and mirroring
committed offsets to a consumer group (:mod:`~txstore.kafka.mirror`), and telling why a
broker's certificate was refused, with a TLS handshake of Python's own
(:mod:`~txstore.kafka.certificates`).

May import: ``txstore.core`` and confluent-kafka; never PostgreSQL, Spark or the driver.
"""
