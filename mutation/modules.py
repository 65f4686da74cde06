"""The modules ``./dev mutate`` mutates: per module, the scopes whose mutants are made and the
fast tests that must kill them (:data:`MODULES`); the runner is :mod:`mutation.mutate`.

A scope is a function, a class or ``Class.method``; a module's tests are chosen to run in
seconds without Spark or a broker process (PostgreSQL where the guard is SQL).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EQUIVALENT = REPO / "mutation" / "EQUIVALENT.md"
"""The survivors that cannot change behaviour, by id, each with why."""

# Fast tests first: a mutant is usually killed by the first failing test (pytest -x).
CORE = "tests/core/test_guarantee_core.py"
GUARDS = "tests/postgres/test_guarantee_guards.py"
SPLIT = "tests/core/test_split_uneven.py"
READER = "tests/kafka/test_reader_bounds.py"
DB = "tests/postgres/test_guarantee_db.py"
STREAM = "tests/spark/stream/test_stream_guards.py"
STREAM_SINK_TESTS = (
    "not (test_micro_batch or option or spans_merge or saved_plan or receipt or identity or alignment "
    "or tasks_option or starts_at or capped or available_now or second_query or gone or only_catches "
    "or catching_up or another_sinks or moved_in_part or refuses_a_database or generation "
    "or counting_source_takes)"
)
"""The stream guard tests of the sink's modules (the writing tasks, the writer and its commit)."""
STREAM_SOURCE_TESTS = (
    "not (test_micro_batch_ or stream_option or count_messages_option or spans_merge or test_a_table_sink "
    "or saved_plan or plan_s_ or receipts_of or retried_task_s_receipt)"
)
"""The stream guard tests of the source's modules (offsets, checkpoint checks, planning, reading tasks)."""
# Tests named by what they exercise, for pytest -k.
PLANNER = (
    "first_plan or plan_is_capped or plan_carries or stop_the_plan or changed_one_stops or starting_timestamp "
    "or planning_failures"
)
PUBLISHER = (
    "pending_row or chunk_is_bounded or set_aside_rows or passing_failure or local_queue or pruned "
    "or producer_keeps or publish_chunk or not_confirmed or refuses_for_good or producer_refused "
    "or failing_outright or publisher_prunes or retention"
)


@dataclass(frozen=True)
class Module:
    name: str
    path: str
    scopes: tuple[str, ...]
    tests: tuple[str, ...]
    keyword: str | None = None  # pytest -k over the selection
    timeout: float = 120.0  # per mutant, at most (a few times the unmutated run's time is used)


MODULES = (
    Module(
        "ranges",
        "txstore/core/ranges.py",
        (
            "OffsetRange",
            "PartitionHistory",
            "plan_ranges",
            "recreated_topics",
            "aged_out",
            "limit_ranges",
            "group_ranges",
            "split_ranges",
            "topic_ids_to_store",
            "without_vanished",
        ),
        (SPLIT, CORE, "tests/core/test_planning.py", "tests/spark/ranges/test_task_groups.py"),
    ),
    Module(
        "sink",
        "txstore/postgres/sink.py",
        (
            "_DELTAS",
            "_UPSERT_BODY",
            "_UPSERT_AND_OUTBOX",
            "_EMPTY_OUTBOX",
            "MOVE_OFFSETS",
            "RECORD_BAD_MESSAGES",
            "classify_conflict",
            "classify_batch_conflict",
            "outbox_identity",
            "require_transactions",
            "TransactionalSink",
            "commit_if_offsets_move",
            "move_offsets_params",
            "bad_message_params",
        ),
        (CORE, GUARDS, DB),
    ),
    Module(
        "planning",
        "txstore/planning.py",
        ("Planner",),
        (GUARDS, DB),
        f"{PLANNER} or plan_asks or another_instance or topic_id or lost_range or pattern_planner or planner_records "
        "or recreated_topic_s_aged or even_an_idle_plan or idle_plan",
    ),
    Module(
        "idle",
        "txstore/core/idle.py",
        ("IdlePlan", "idle_plan", "next_is_idle"),
        ("tests/core/test_idle_plan.py", DB, STREAM),
        "idle",
    ),
    Module(
        "log_offsets",
        "txstore/kafka/log_offsets.py",
        (
            "moving_leadership",
            "unsettled",
            "consumers_for",
            "LookupConsumers",
            "consumer_log_offsets",
            "consumer_lookup",
            "_ask_share",
            "_lookup_once",
            "moving_within",
            "answer_settled",
            "ask_again",
        ),
        ("tests/kafka/test_real_kafka_quirks.py",),
    ),
    Module(
        "reader",
        "txstore/kafka/reader.py",
        (
            "_out_of_range",
            "RangeReader.__init__",
            "RangeReader.last",
            "RangeReader.__iter__",
            "RangeReader._batches",
            "RangeReader._check_expected_last",
            "RangeReader._check_same_log",
            "RangeReader._verified",
            "RangeReader._raise_for",
            "last_messages",
        ),
        (READER, GUARDS),
        "not (generation or publish_chunk or not_confirmed or refuses_for_good or lost_range or topic_id)",
    ),
    Module(
        "fingerprint",
        "txstore/core/fingerprint.py",
        ("_ABSENT", "Fingerprint", "digest", "fingerprint"),
        (CORE, READER, "tests/core/test_planning.py"),
    ),
    Module(
        "topic_ids",
        "txstore/kafka/topic_ids.py",
        ("fetch_topic_ids", "TopicIds", "_topic_ids", "read_message_at", "message_at_last_counted"),
        (CORE, READER),
    ),
    Module(
        "results",
        "txstore/core/results.py",
        ("metric_text", "_EXACT", "exact_decimal", "add_metrics", "row_order", "decode_key", "encode_key"),
        (CORE, "tests/core/test_exact_sums.py", DB),
        f"not ({PLANNER} or {PUBLISHER} or idempotent)",
    ),
    Module(
        "idempotent",
        "txstore/postgres/idempotent.py",
        ("_INSERT", "_ADVANCE", "_rows", "IdempotentSink"),
        (GUARDS, DB),
        "idempotent or generation or committed_only or forgotten or any_point or autocommit or own_row "
        "or without_messages or transform or returning",
    ),
    Module(
        "outbox",
        "txstore/postgres/outbox.py",
        (
            "outbox_counts",
            "pending_count",
            "retry_set_aside",
            "_Outcome",
            "OutboxPublisher.publish_pending",
            "OutboxPublisher.prune_sent",
            "OutboxPublisher._lock_chunk",
            "OutboxPublisher._publish_chunk",
            "OutboxPublisher._produce",
            "OutboxPublisher._produce_one",
        ),
        (GUARDS, DB),
        PUBLISHER,
    ),
    Module(
        "producers",
        "txstore/kafka/producers.py",
        ("producer_config", "set_aside_reason"),
        (GUARDS, DB),
        PUBLISHER,
    ),
    Module(
        "store",
        "txstore/postgres/store.py",
        (
            "append_lag_sample",
            "committed_state",
            "offset_rows",
            "versioned_rows",
            "rows_version",
            "state_of",
            "record_topic_ids",
            "first_generation_sql",
            "create_start_rows",
            "record_lost_ranges",
            "stored_offsets",
        ),
        (GUARDS, DB),
        f"not ({PUBLISHER})",
    ),
    Module(
        "badmessages",
        "txstore/kafka/bad_messages.py",
        ("is_message_failure", "aggregate_range", "isolate", "_bisect"),
        (CORE, READER),
    ),
    Module(
        "kept",
        "txstore/postgres/kept.py",
        ("_answers", "_take", "kept_connection", "close_kept"),
        ("tests/postgres/test_kept_connection.py",),
    ),
    Module(
        "patterns",
        "txstore/core/patterns.py",
        (
            "compile_topic_pattern",
            "matches",
            "matching_topics",
            "PatternTopics",
            "resolve_pattern",
            "joining_starts",
        ),
        ("tests/core/test_topic_patterns.py", "tests/core/test_subscription.py"),
        "matches_whole or does_not_compile or flag_is_exclusive or first_run_and or one_of_subscribe "
        "or asks_for_no_change or frozen_values",
    ),
    Module(
        "assignment",
        "txstore/core/assignment.py",
        ("parse_assignment", "assigned_keys", "check_assigned_starts", "assigned_only", "_names"),
        ("tests/core/test_assigned_partitions.py",),
        "parsed_as_topics or bad_assignment or exactly_one_of or names_exactly_the_assigned "
        "or plans_only_the_assigned or kafka_does_not_have or leaves_its_other_rows or flag_takes "
        "or bad_assign_flag",
    ),
    Module(
        "subscription",
        "txstore/core/subscription.py",
        ("Subscription", "subscription_of", "subscription_json", "subscription_from_json"),
        ("tests/core/test_subscription.py",),
    ),
    Module(
        "bad_rows",
        "txstore/spark/ranges/bad_rows.py",
        ("is_row_failure", "failure_reason", "find_bad_offsets", "_bisect", "without"),
        ("tests/spark/ranges/test_bad_rows.py",),
    ),
    Module(
        "micro_batch",
        "txstore/core/micro_batch.py",
        (
            "StreamPlan.reading",
            "StreamPlan.pieces_of",
            "StreamPlan.tasks_of",
            "spans_array",
            "spans_from_array",
            "merge_spans",
            "verify_micro_batch",
            "whole_read",
            "_check_spans",
            "_check_counts",
        ),
        (STREAM,),
        "test_micro_batch or spans_merge or become_spans or piece",
    ),
    Module(
        "stream_plans",
        "txstore/postgres/stream_plans.py",
        (
            "_SAVE_PLAN",
            "_RECORD_READ",
            "plan_identity",
            "tasks_of",
            "ranges_json",
            "ranges_from_json",
            "save_plan",
            "load_plan",
            "mark_committed",
            "_read_json",
            "record_read",
            "load_reads",
        ),
        (STREAM,),
        "plan or receipt or piece",
    ),
    Module(
        "stream_options",
        "txstore/spark/stream/stream_options.py",
        ("parse_stream_options", "parse_count_messages", "parse_tasks"),
        (STREAM,),
        "option",
    ),
    Module(
        "stream_offsets",
        "txstore/spark/stream/stream_offsets.py",
        ("micro_batch_tasks", "offsets_dict", "offsets_map", "batch_ranges"),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_checkpoint",
        "txstore/spark/stream/stream_checkpoint.py",
        (
            "past_recorded_losses",
            "losses_to_record",
            "check_checkpoint_assigned",
            "check_checkpoint_in_log",
            "check_idle_start",
            "check_alignment",
            "check_batch_ends",
        ),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_source",
        "txstore/spark/stream/stream_source.py",
        (
            "TxstoreStreamReader.__init__",
            "TxstoreStreamReader.initialOffset",
            "TxstoreStreamReader._initial_offsets",
            "TxstoreStreamReader.latestOffset",
            "TxstoreStreamReader._still_idle",
            "TxstoreStreamReader.partitions",
            "TxstoreStreamReader._skip_lost",
        ),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_follow",
        "txstore/spark/stream/stream_follow.py",
        (
            "FollowsCheckpoint.commit",
            "FollowsCheckpoint._awaiting_spark_commit",
            "FollowsCheckpoint._follow_checkpoint",
            "FollowsCheckpoint._caught_up",
        ),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_partitions",
        "txstore/spark/stream/stream_partitions.py",
        (
            "QueryPartitions._watermarks",
            "QueryPartitions._resolve_topics",
            "QueryPartitions._job_state",
            "QueryPartitions._topic_ids",
            "QueryPartitions._start_decisions",
            "QueryPartitions._start_rows",
        ),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_session",
        "txstore/spark/stream/stream_session.py",
        ("PlanningSession._db",),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_tasks",
        "txstore/spark/stream/stream_tasks.py",
        ("ReadingTasks.read", "ReadingTasks._record", "ReadingTasks._messages", "ReadingTasks._count"),
        (STREAM,),
        STREAM_SOURCE_TESTS,
    ),
    Module(
        "stream_write_tasks",
        "txstore/spark/stream/stream_write_tasks.py",
        ("_batch_spans", "_row_spans", "_task_spans", "deliver", "table_rows"),
        (STREAM,),
        STREAM_SINK_TESTS,
    ),
    Module(
        "stream_sink",
        "txstore/spark/stream/stream_sink.py",
        (
            "_unplaceable",
            "check_table_query",
            "check_rows_in_batch",
            "TxstoreStreamWriter.__init__",
            "TxstoreStreamWriter.write",
            "TxstoreStreamWriter.commit",
            "TxstoreStreamWriter._commit_table",
        ),
        (STREAM,),
        STREAM_SINK_TESTS,
    ),
)
