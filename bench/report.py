"""Results: the JSON document, a short table, and a PNG chart."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """Floats rounded for reading, NaN as null (JSON has no NaN)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 4)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(document: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(_clean(document), indent=2) + "\n")
    return path


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:,.0f}"


def main_limit(document: dict[str, Any]) -> dict[str, Any]:
    """The limit of the main workload's median pair: its run of the chosen raw strategy."""
    main = document["main"]
    limit: dict[str, Any] = main["median_pair"]["limit"]["strategies"][main["limit_strategy"]]
    return limit


def print_table(document: dict[str, Any]) -> None:
    main = document["main"]
    pair = main["median_pair"]
    w = main["workload"]
    print()
    print(
        f"count_topic --once, {w['messages']:,} messages ({w['value_bytes']} B values) over "
        f"{w['partitions']} partitions, {document['cores']} cores; load average at start "
        f"{document['machine']['load_average_at_start']}"
    )
    b = pair["job"]["breakdown_ms"]
    print(
        f"  median pair: job {pair['job']['messages_per_second']:,.0f} msg/s vs limit "
        f"{main_limit(document)['messages_per_second']:,.0f} msg/s ({main['limit_strategy']}); batch {pair['job']['wall_ms']:,.0f} ms = plan "
        f"{b['plan']:,.0f} + read/aggregate {b['read_aggregate']:,.0f} + commit {b['commit']:,.0f} + Spark/other "
        f"{b['spark_and_other']:,.0f}"
    )
    paths = document.get("paths")
    if paths:
        print(f"  paths over the same messages, median of {paths['rounds']} rounds:")
        for label, rate in paths["messages_per_second_median"].items():
            print(f"    {label:36s} {rate:>12,.0f} msg/s")
        for name, ratio in paths["ratios"].items():
            print(f"    {name:66s} {ratio['median']:.2f}")
    c = document["commit_latency_ms"]
    print(f"  commit per range: p50 {_fmt(c['p50'])} ms, p99 {_fmt(c['p99'])} ms over {c['ranges']} ranges")
    print()
    rows = [("target", "measured", "limit", "")]
    for t in document["targets"]:
        verdict = "n/a" if t["passed"] is None else ("PASS" if t["passed"] else "MISS")
        rows.append((t["target"], _fmt(t["measured"]), _fmt(t["limit"]), verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)))
    sweep = document["sweep"]
    if sweep["cells"]:
        print()
        print(f"  sweep ({sweep['value_bytes']} B values): messages partitions  job ms   ratio  worker MiB")
        for cell in sweep["cells"]:
            print(
                f"  {cell['workload']['messages']:>29,} {cell['workload']['partitions']:>10} "
                f"{cell['job']['wall_ms']:>8,.0f} {cell['ratio']:>7.2f} "
                f"{cell['job']['memory']['python_worker_max_mib']:>11.0f}"
            )
    for s in sweep["skipped"]:
        print(f"  skipped {s['messages']:,} messages / {s['partitions']} partitions: {s['reason']}")
    print()


def _label(messages: int, partitions: int) -> str:
    exponent = math.log10(messages) if messages > 0 else 0
    text = f"1e{exponent:.0f}" if exponent == int(exponent) else f"{messages:,}"
    return f"{text} / {partitions}p"


def write_chart(document: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = document["main"]
    cells = document["sweep"]["cells"]
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    fig.suptitle(
        f"txstore count_topic vs raw parallel read ({document['cores']} cores, "
        f"load avg at start {document['machine']['load_average_at_start'][0]})"
    )

    # 1. throughput against the limit
    ax = axes[0][0]
    entries = [
        ("main " + _label(main["workload"]["messages"], main["workload"]["partitions"]), main["median_pair"])
    ]
    entries += [(_label(c["workload"]["messages"], c["workload"]["partitions"]), c) for c in cells]
    xs = range(len(entries))
    limit = [e["limit"]["messages_per_second"] / 1000 for _, e in entries]
    limit[0] = main_limit(document)["messages_per_second"] / 1000
    job = [e["job"]["messages_per_second"] / 1000 for _, e in entries]
    ax.bar([x - 0.2 for x in xs], limit, 0.4, label="raw parallel read (limit)", color="#999999")
    ax.bar([x + 0.2 for x in xs], job, 0.4, label="count_topic --once", color="#1f77b4")
    for x, (_, e) in zip(xs, entries, strict=False):
        ax.text(
            x + 0.2,
            e["job"]["messages_per_second"] / 1000,
            f"{e['ratio']:.2f}x",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(list(xs), [n for n, _ in entries], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("thousand messages / s")
    ax.set_title("Throughput against the limit (ratio above the job's bar; target >= 0.8)")
    ax.legend(fontsize=8)

    # 2. batch-time breakdown, as shares of each batch's wall time
    ax = axes[0][1]
    batches = [("main", main["median_pair"]["job"])]
    for t in document["trickle"].values():
        batches.append((f"trickle {t['partitions']}p", t["median_batch"]))
    batches += [(_label(c["workload"]["messages"], c["workload"]["partitions"]), c["job"]) for c in cells]
    parts = [
        ("plan", "plan", "#2ca02c"),
        ("read_aggregate", "read + aggregate", "#1f77b4"),
        ("commit", "commit", "#d62728"),
        ("spark_and_other", "Spark and the rest", "#bbbbbb"),
    ]
    left = [0.0] * len(batches)
    for part, label, color in parts:
        shares = [100 * b["breakdown_ms"][part] / b["wall_ms"] for _, b in batches]
        ax.barh(range(len(batches)), shares, left=left, color=color, label=label)
        left = [a + s for a, s in zip(left, shares, strict=False)]
    ax.set_yticks(range(len(batches)), [f"{n} ({b['wall_ms']:,.0f} ms)" for n, b in batches], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("% of batch wall time")
    ax.set_title("Batch time: plan / read+aggregate / commit / Spark and the rest")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4)

    # 3. batch time against messages
    ax = axes[1][0]
    for p in sorted({c["workload"]["partitions"] for c in cells}):
        row = sorted(
            (c for c in cells if c["workload"]["partitions"] == p), key=lambda c: c["workload"]["messages"]
        )
        ns = [c["workload"]["messages"] for c in row]
        ax.plot(ns, [c["job"]["wall_ms"] / 1000 for c in row], "o-", label=f"job, {p} partitions")
        ax.plot(ns, [c["limit"]["seconds"] for c in row], "x--", color="#999999", alpha=0.7)
    ax.plot([], [], "x--", color="#999999", label="raw read (limit)")
    if cells:
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "sweep not run", ha="center", transform=ax.transAxes)
    ax.set_xlabel("messages in the batch")
    ax.set_ylabel("batch wall time (s)")
    ax.set_title("Scaling with messages (linear = slope 1)")
    ax.legend(fontsize=8)

    # 4. batch time against partitions
    ax = axes[1][1]
    for n in sorted({c["workload"]["messages"] for c in cells}):
        row = sorted(
            (c for c in cells if c["workload"]["messages"] == n), key=lambda c: c["workload"]["partitions"]
        )
        if row:
            ax.plot(
                [c["workload"]["partitions"] for c in row],
                [c["job"]["wall_ms"] / 1000 for c in row],
                "o-",
                label=f"job, {n:,} messages",
            )
    trickle = sorted(document["trickle"].values(), key=lambda t: t["partitions"])
    if trickle:
        ax.plot(
            [t["partitions"] for t in trickle],
            [t["p50_ms"] / 1000 for t in trickle],
            "s-",
            label=f"--interval trickle batch ({trickle[0]['messages_per_batch']} messages), p50",
        )
        ax.axhline(1.0, color="#d62728", linestyle=":", label="trickle target 1 s")
    if cells or trickle:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({c["workload"]["partitions"] for c in cells} | {t["partitions"] for t in trickle})
        ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("partitions")
    ax.set_ylabel("batch wall time (s)")
    ax.set_title("Scaling with partitions")
    ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
