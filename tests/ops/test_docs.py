"""The documentation site builds with --strict (no broken link, every page in the nav)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [
            mkdocs,
            "build",
            "--strict",
            "--quiet",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_fits_on_a_few_screens_and_every_relative_link_in_it_resolves() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250, "README.md is the front page: move detail into docs/"
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [t for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    assert relative, "README.md links into docs/"
    broken = [t for t in relative if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"
    anchors = [t.split("#", 1) for t in relative if "#" in t and t.endswith(".md") is False]
    missing = [f"{path}#{anchor}" for path, anchor in anchors if anchor not in heading_ids(ROOT / path)]
    assert not missing, f"README.md links to headings that do not exist: {missing}"


def heading_ids(page: Path) -> set[str]:
    """The ids MkDocs gives a page's headings (the toc extension's default slugs)."""
    ids = set()
    for heading in re.findall(
        r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M), re.M
    ):
        text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
        ids.add(re.sub(r"[-\s]+", "-", text).strip("-"))
    return ids


# ---------------------------------------------------------------------------------------------
# Commands on the how-to and getting-started pages are run by tests (or allowed here, with why)

COMMAND_PAGES = ("how-to", "getting-started")
COMMAND_START = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(\./dev|txstore|(?:\S*/)?spark-submit|python|alembic)(?:\s|$)"
)

AGGREGATE_EXAMPLE = (
    "spark-submit jobs/aggregate.py --topic orders --job sales --interval 10 --table reporting.sales_by_country "
    "--key country --merge revenue=sum,orders=sum,largest=max,first_seen=keep,last_seen=replace "
    """--sql "SELECT get_json_object(CAST(value AS STRING), '$.country') AS country, """
    "sum(CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DECIMAL(12, 2))) AS revenue, "
    "count(*) AS orders, max(CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DECIMAL(12, 2))) "
    'AS largest, min(timestamp) AS first_seen, max(timestamp) AS last_seen FROM batch GROUP BY 1"'
)

# A command no test runs as shown, and why that is all right. Keyed by the command as shown
# (continuation lines joined, the trailing comment and a leading "$ " dropped).
ALLOWED: dict[str, str] = {
    "./dev demo": "`txstore demo` behind it is run by tests/ops/test_demo_and_dataframe.py; `./dev` only installs first",
    "./dev demo --kafka real": "`txstore demo --kafka real` behind it is run by "
    "tests/ops/test_demo_and_dataframe.py (on Apache Kafka); `./dev` only installs first",
    "./dev test": "what CI runs (.ci/run): the suite this test is part of",
    "txstore count-topic --topic events --once": "the console command calls txstore.count_topic.main, the same as "
    "jobs/count_topic.py, which tests run with these flags (test_count_topic.py, test_job_process.py)",
    "txstore py-files --output txstore-pyfiles.zip": "prints build_py_files(output); test_cluster.py builds the zip "
    "with build_py_files and runs spark-submit --py-files with it",
    # results-tables.md, the sales example: continuation lines and the quoted query joined
    AGGREGATE_EXAMPLE: "test_results_table.py runs jobs/aggregate.py with --table, --key, --merge and --sql "
    "(its sales query); --interval is the batch loop every job shares (txstore/options.py), run by "
    "test_job_process.py and the chaos suite",
}


def shown_commands(page: Path) -> list[str]:
    """The commands of a page's ```bash and ```console blocks that start with a checked program."""
    commands = []
    for block in re.finditer(r"^```(?:bash|console)\n(.*?)^```", page.read_text(), re.S | re.M):
        pending = ""
        for line in block.group(1).split("\n"):
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            if (pending + line).count('"') % 2:  # a quoted argument over several lines
                pending += line + " "
                continue
            line, pending = (pending + line).strip(), ""
            line = line.removeprefix("$ ")
            line = re.sub(r"\s+#.*$", "", line)
            line = re.sub(r"\s+", " ", line)
            if COMMAND_START.match(line):
                commands.append(line)
    return commands


def command_key(command: str) -> tuple[str, list[str]]:
    """What a test that runs the command must name: its script, module or subcommand, and its flags."""
    words = [w for w in command.split() if not re.match(r"^[A-Z_]+=", w)]
    program = words[0]
    flags = sorted({m.group(1) for m in re.finditer(r"(?<![\w-])(--[a-z][a-z0-9-]*)", command)})
    if program == "python" and len(words) > 2 and words[1] == "-m":
        return words[2], flags
    if "--class" in words[:-1]:  # spark-submit --class C: a JVM application such as the Connect server
        return words[words.index("--class") + 1], flags
    script = next((w for w in words if w.endswith(".py")), None)
    if script is not None:
        return Path(script).name, flags
    if program in ("txstore", "alembic", "./dev") and len(words) > 1:
        return f"{program} {words[1]}", flags
    return program, flags


def read_tests() -> dict[Path, str]:
    return {
        p: p.read_text(errors="replace") for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py"
    }


def mentions(text: str, key: str) -> bool:
    if " " in key:  # "txstore status": the subcommand as an argument list element or as typed
        program, sub = key.split(" ", 1)
        return program in text and bool(re.search(rf"""["']{re.escape(sub)}["']|{re.escape(key)}\b""", text))
    return bool(re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", text))


@pytest.mark.slow
def test_every_command_on_the_how_to_pages_is_run_by_a_test_or_allowed() -> None:
    tests = read_tests()
    unchecked = []
    seen = set()
    for page in sorted(p for d in COMMAND_PAGES for p in (ROOT / "docs" / d).glob("*.md")):
        for command in shown_commands(page):
            seen.add(command)
            if command in ALLOWED:
                continue
            key, flags = command_key(command)
            files = [text for text in tests.values() if mentions(text, key)]
            missing = [
                flag for flag in flags if not any(re.search(rf"{flag}(?![\w-])", text) for text in files)
            ]
            if not files or missing:
                why = (
                    f"no test names {key!r}" if not files else f"no test that names {key!r} passes {missing}"
                )
                unchecked.append(f"{page.relative_to(ROOT)}: {command}  ({why})")
    assert not unchecked, (
        "commands no test runs (run them in a test, or add them to ALLOWED with why):\n"
        + "\n".join(unchecked)
    )
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"ALLOWED lists commands no page shows any more: {stale}"


def test_the_readme_and_the_roles_page_give_the_same_job_role_sql() -> None:
    """tests/postgres/test_logins_and_tls.py runs the README's copy; the site shows the page's."""
    pattern = r"```sql\n(-- txstore: a role for jobs\n.*?)```"
    readme = re.findall(pattern, (ROOT / "README.md").read_text(), re.S)
    page = re.findall(pattern, (ROOT / "docs" / "how-to" / "tls-and-roles.md").read_text(), re.S)
    assert len(readme) == 1 and len(page) == 1
    assert readme == page


def test_docker_compose_runs_the_kafka_and_postgresql_versions_the_tests_use() -> None:
    """docker-compose.yml is what a newcomer starts: the broker the tests and the benchmark run
    (Apache Kafka, txstore/testing/kafka_jars.py) and the PostgreSQL CI tests, as the supported
    versions page states them."""
    from txstore.testing.kafka_jars import KAFKA_VERSION

    images = dict(
        re.findall(r"^  ([a-z]+):\n    image: (\S+)$", (ROOT / "docker-compose.yml").read_text(), re.M)
    )
    assert images["kafka"] == f"apache/kafka:{KAFKA_VERSION}"
    page = (ROOT / "docs" / "reference" / "supported-versions.md").read_text()
    [kafka_row] = re.findall(r"^\| Apache Kafka \|.*$", page, re.M)
    assert f"| {KAFKA_VERSION} " in kafka_row
    [postgres_tested] = re.findall(r"^\| PostgreSQL \| 15\+ \| (\d+) ", page, re.M)
    assert images["postgres"] == f"postgres:{postgres_tested}"


def test_the_options_page_has_a_row_for_every_option_of_spark_s_kafka_source() -> None:
    from txstore.spark.source.read_options import NOT_TAKEN, SPARK_OPTION_NAMES

    page = (ROOT / "docs" / "reference" / "spark-kafka-options.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)`[^|]* \| (.+)$", page, re.M)}
    missing = [name for name in SPARK_OPTION_NAMES if name not in rows]
    assert not missing, f"docs/reference/spark-kafka-options.md has no row for {missing}"
    for name in SPARK_OPTION_NAMES:  # an option the parser refuses is not called supported
        if name.lower() in NOT_TAKEN:
            assert not rows[name].startswith("supported"), name
