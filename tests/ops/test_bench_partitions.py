"""``python -m bench.partitions``'s report (bench/partitions.py): medians with their spread, the
largest count's idle batch over the smallest's taken per round, and issue 38's targets."""

from __future__ import annotations

import pytest

from bench.partitions import main, summarize


def _round(
    idle8: float,
    idle1024: float,
    warm: float,
    status: float,
    stream8: float = 4.0,
    stream1024: float = 12.0,
    stream_warm: float = 0.8,
    stream_status: float = 0.6,
) -> dict[str, dict[str, float]]:
    def at(
        idle: float, stream: float, warm_ms: float, status_s: float, query: tuple[float, float]
    ) -> dict[str, float]:
        return {
            "idle_ms": idle,
            "stream_idle_ms": stream,
            "warm_ms_per_range": warm_ms,
            "status_seconds": status_s,
            "stream_warm_ms_per_range": query[0],
            "stream_status_seconds": query[1],
            "load_1min": 2.0,
        }

    return {
        "8": at(idle8, stream8, 5.0, 0.5, (9.0, 0.5)),
        "1024": at(idle1024, stream1024, warm, status, (stream_warm, stream_status)),
    }


def test_the_partitions_report_takes_ratios_per_round_and_checks_the_targets_at_the_largest_count() -> None:
    rounds = [_round(10, 30, 0.5, 0.7), _round(20, 50, 0.9, 0.8), _round(10, 50, 1.5, 1.2)]
    summary = summarize(rounds, [8, 1024])
    assert summary["idle_1024_over_8"] == {"median": 3.0, "lowest": 2.5, "highest": 5.0}
    assert summary["stream_idle_1024_over_8"] == {"median": 3.0, "lowest": 3.0, "highest": 3.0}
    assert summary["by_partitions"]["1024"]["warm_ms_per_range"] == {
        "median": 0.9,
        "lowest": 0.5,
        "highest": 1.5,
    }
    assert summary["by_partitions"]["1024"]["stream_warm_ms_per_range"]["median"] == 0.8
    assert summary["targets"] == {
        "idle batch at 1024 partitions <= 4x 8": True,
        "idle stream plan at 1024 partitions <= 4x 8": True,
        "warm batch at 1024 partitions <= 1 ms a range": True,
        "txstore status at 1024 partitions < 1 s": True,
        "warm stream micro-batch at 1024 partitions <= 1 ms a range": True,
        "txstore status of the stream's job at 1024 partitions < 1 s": True,
    }
    slow = summarize([_round(10, 50, 1.2, 1.1, 4.0, 20.0, 1.1, 1.0)], [8, 1024])
    assert list(slow["targets"].values()) == [False] * 6


def test_the_partitions_benchmark_wants_two_partition_counts() -> None:
    with pytest.raises(SystemExit, match="at least two partition counts"):
        main(["--partitions", "1024"])
