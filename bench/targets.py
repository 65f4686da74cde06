"""The benchmark's targets (``python -m bench``): each a ratio of two measurements taken side by
side in one run, judged against its limit (:func:`evaluate`); the run itself is :mod:`bench.run`.
"""

from __future__ import annotations

from typing import Any


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured ratio beside it."""
    targets: list[dict[str, Any]] = []

    def add(name: str, measured: float | None, limit: float, passed: bool | None, note: str) -> None:
        targets.append({"target": name, "measured": measured, "limit": limit, "passed": passed, "note": note})

    main = results["main"]
    add(
        "throughput / raw parallel read rate",
        main["ratio_median"],
        0.8,
        main["ratio_median"] >= 0.8,
        f"median of {len(main['pairs'])} side-by-side pairs against the raw strategy fastest over all "
        f"pairs ({main['limit_strategy']}), >= 0.8; against the fastest raw run in each pair: "
        f"{main['ratio_median_vs_fastest_in_each_pair']:.2f}",
    )
    for name, limit, what in (
        ("classic DataFrame / classic per-range", 0.8, "DataFrame aggregate path / per-range count path"),
        (
            "classic DataFrame, counted by Spark / classic per-range",
            0.8,
            "DataFrame aggregate path, push_down_counts=False / per-range count path",
        ),
        (
            "classic DataFrame, all columns / classic per-range",
            0.8,
            "DataFrame aggregate path, all columns declared / per-range count path",
        ),
        ("Connect per-range / classic per-range", 0.8, "Connect / classic, per-range count path"),
        ("Connect DataFrame / classic DataFrame", 0.8, "Connect / classic, DataFrame aggregate path"),
    ):
        found = results["paths"]["ratios"].get(name)
        if found is not None:
            add(
                what,
                found["median"],
                limit,
                found["median"] >= limit,
                f"median over {results['paths']['rounds']} rounds of the ratio within a round, >= {limit} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in found['rounds'])})",
            )
    add(
        "commit share of batch time",
        main["commit_share_median"],
        0.05,
        main["commit_share_median"] <= 0.05,
        "summed commit time / (parallel tasks x batch wall time), <= 0.05",
    )
    idle = main["idle"]
    add(
        "idle batch (ms)",
        idle["p50_ms"],
        50.0,
        idle["p50_ms"] <= 50.0 and idle["spark_jobs_launched"] == 0,
        f"median of {idle['batches']}, <= 50 ms and no Spark job "
        f"(max {idle['max_ms']:.1f} ms, {idle['spark_jobs_launched']} Spark jobs)",
    )
    trickle = results["trickle"]
    if trickle:
        most = max(trickle.values(), key=lambda t: t["partitions"])
        add(
            f"trickle --interval batch, {most['partitions']} partitions (ms)",
            most["p50_ms"],
            1000.0,
            most["p50_ms"] <= 1000.0,
            f"median of {len(most['wall_ms'])}, <= 1000 ms (p90 {most['p90_ms']:.0f}, max {most['max_ms']:.0f})",
        )
    cells = {(c["workload"]["partitions"], c["workload"]["messages"]): c for c in results["sweep"]["cells"]}
    for n in sorted({n for _, n in cells}):
        if (8, n) in cells and (64, n) in cells:
            ratio = cells[(64, n)]["job"]["wall_ms"] / cells[(8, n)]["job"]["wall_ms"]
            add(f"64 / 8 partitions batch time, {n:,} messages", ratio, 1.5, ratio <= 1.5, "<= 1.5")
    by_messages = sorted(
        ((n, c) for (p, n), c in cells.items() if p == max(p for p, _ in cells)), key=lambda x: x[0]
    )
    if len(by_messages) >= 2:
        # Linear: the time per message does not rise with the batch (fixed costs make
        # it fall). Compared between the two largest batches, where fixed costs are
        # small; the job/limit ratio shows the job keeping pace with plain reading.
        (nb, cb), (nc, cc) = by_messages[-2:]
        per_b = cb["job"]["wall_ms"] / nb * 1000
        per_c = cc["job"]["wall_ms"] / nc * 1000
        add(
            f"time per message at {nc:,} / at {nb:,} messages",
            per_c / per_b,
            1.25,
            per_c / per_b <= 1.25,
            f"linear: <= 1.25 ({per_b:.2f} -> {per_c:.2f} us per message; job/limit ratio "
            f"{cb['ratio']:.2f} -> {cc['ratio']:.2f})",
        )
        (n0, c0), (n1, c1) = by_messages[0], by_messages[-1]
        for part in ("python_worker_max_mib", "python_driver_mib", "jvm_mib"):
            m0, m1 = c0["job"]["memory"][part], c1["job"]["memory"][part]
            ratio = m1 / m0 if m0 else None
            add(
                f"peak memory {part.removesuffix('_mib')}, {n0:,} -> {n1:,} messages",
                ratio,
                1.25,
                None if ratio is None else ratio <= 1.25,
                f"{m0:.0f} -> {m1:.0f} MiB, <= 1.25x",
            )
    if cells:
        # Steady state: the largest batch, where a batch's fixed costs (planning, a Spark job,
        # a task per core) are a small share of its time.
        (p, n), biggest = max(cells.items(), key=lambda item: (item[0][1], item[0][0]))
        add(
            f"steady-state per-range count path / raw parallel read, {n:,} messages / {p} partitions",
            biggest["ratio"],
            1.0,
            biggest["ratio"] >= 1.0,
            "the sweep's largest batch against the fastest raw strategy in its pair, >= 1.0",
        )
    return targets
