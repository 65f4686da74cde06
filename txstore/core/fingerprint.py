"""The identity of the last message counted, to notice a deleted and recreated topic.

A recreated topic starts again at offset 0, so once it holds more messages
than a job's stored offset, offsets alone cannot tell it from the old topic:
the job would read ``[stored offset, new end)``, losing the new topic's first
messages and adding its counts to the old totals. So beside each committed
offset the job keeps a :class:`Fingerprint` of the last message it counted
(offset, timestamp, digest of key and value). Before counting a range the
reader reads that message again: another message at that offset means
another log (:class:`~txstore.core.errors.TopicRecreated`); no message there
(compaction, retention) cannot be compared and is not an error.

Pure: no Kafka, Spark or database needed.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from txstore.core.errors import TopicRecreated

_ABSENT = struct.pack(">q", -1)


@dataclass(frozen=True)
class Fingerprint:
    """One message's identity: its offset, timestamp (ms, None if it has none) and key+value digest."""

    offset: int
    timestamp: int | None
    digest: str

    def describe(self) -> str:
        ts = "none" if self.timestamp is None else str(self.timestamp)
        return f"offset {self.offset}, timestamp {ts}, digest {self.digest}"


def digest(key: bytes | None, value: bytes | None) -> str:
    """blake2b-128 (hex) of key and value, each length-prefixed so None, b"" and splits all differ."""
    h = hashlib.blake2b(digest_size=16)
    for part in (key, value):
        if part is None:
            h.update(_ABSENT)
        else:
            h.update(struct.pack(">q", len(part)))
            h.update(part)
    return h.hexdigest()


def fingerprint(message: Any) -> Fingerprint:
    """The fingerprint of a consumed confluent-kafka ``Message``."""
    ts_type, ts = message.timestamp()
    return Fingerprint(
        int(message.offset()), int(ts) if ts_type else None, digest(message.key(), message.value())
    )


def recreated_error(
    job: str,
    topic: str,
    partition: int,
    stored: str,
    found: str,
    reset: str,
    during: str = "",
    stored_label: str = "stored ",
) -> TopicRecreated:
    """The one-line error for a partition whose log is not the one the job counted (``during``:
    when it changed, if not before the read)."""
    return TopicRecreated(
        f"job {job!r} topic {topic!r} partition {partition}: the topic was deleted and recreated{during} "
        f"({stored_label}{stored}; found {found}); nothing was counted. To count the new topic from its "
        f"start as a new generation: {reset}"
    )
