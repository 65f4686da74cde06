"""The connection the stream sink keeps between micro-batches (txstore.postgres.kept), on real
PostgreSQL: kept when a call ends well, replaced when the server ended it, dropped after an
error, and never shared with a forked child."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from txstore.postgres.db import connect
from txstore.postgres.kept import close_kept, kept_connection


@pytest.fixture(autouse=True)
def _nothing_kept_after() -> Iterator[None]:
    yield
    close_kept()


def backend(url: str) -> int:
    with kept_connection(url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])


def test_two_calls_in_a_row_share_one_server_session(database_url: str) -> None:
    assert backend(database_url) == backend(database_url)


def test_a_kept_connection_is_handed_out_outside_any_transaction(database_url: str) -> None:
    """The check before use is rolled back: a caller's ``conn.transaction()`` is then a
    transaction of its own, not a savepoint inside the check's (committed only later)."""
    backend(database_url)
    with kept_connection(database_url) as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_close_kept_ends_the_session_it_kept(database_url: str) -> None:
    first = backend(database_url)
    close_kept()
    with connect(database_url) as other:
        alive = other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone()
    assert alive == (0,)


def test_a_session_the_server_ended_between_calls_is_replaced_before_anything_is_written(
    database_url: str,
) -> None:
    first = backend(database_url)
    with connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    with kept_connection(database_url) as conn:  # checked before the caller's first statement
        conn.execute("CREATE TABLE written_once (n int)")
        conn.execute("INSERT INTO written_once VALUES (1)")
        second = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert second is not None and second[0] != first
    with connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM written_once").fetchone() == (1,)


def test_a_replacement_is_opened_by_the_callers_opener(database_url: str) -> None:
    """The stream sink passes one that waits for a restarting server
    (txstore/postgres/reconnect.py): used when nothing is kept, or the kept session ended."""
    opened: list[str] = []

    def opener(url: str) -> psycopg.Connection:
        opened.append(url)
        return connect(url)

    with kept_connection(database_url, opener) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
    with kept_connection(database_url, opener):
        pass
    assert opened == [database_url]  # the kept one served the second call
    with connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
    with kept_connection(database_url, opener):
        pass
    assert opened == [database_url, database_url]


def test_what_a_call_leaves_open_is_committed_as_with_connect(database_url: str) -> None:
    with kept_connection(database_url) as conn:
        conn.execute("CREATE TABLE left_open (n int)")
        conn.execute("INSERT INTO left_open VALUES (7)")
    with connect(database_url) as other:
        assert other.execute("SELECT n FROM left_open").fetchall() == [(7,)]


def test_a_call_that_raised_leaves_nothing_kept_and_nothing_written(database_url: str) -> None:
    with connect(database_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE not_written (n int)")
    first = backend(database_url)
    with pytest.raises(RuntimeError), kept_connection(database_url) as conn:
        conn.execute("INSERT INTO not_written VALUES (1)")
        raise RuntimeError("the caller failed mid-transaction")
    with connect(database_url) as other:
        assert other.execute("SELECT count(*) FROM not_written").fetchone() == (0,)
        ended = other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone()
        assert ended == (0,)  # closed, not left idle in its transaction
    assert backend(database_url) != first


@pytest.mark.parametrize("first", ["takes", "closes_everything"])
def test_a_forked_child_opens_its_own_session_and_leaves_the_parents_alone(
    database_url: str, first: str
) -> None:
    """A child inherits the parent's kept connection (its socket): taking one opens its own, and
    ``close_kept`` there closes nothing of the parent's, whichever the child does first."""
    parent = backend(database_url)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: leave without Python's clean-up
        try:
            if first == "closes_everything":
                close_kept()
            os.write(write, str(backend(database_url)).encode())
            close_kept()
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = int(os.read(read, 64).decode() or 0)
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child not in (0, parent)
    assert backend(database_url) == parent  # the parent's session still answers, still kept


def test_a_connection_left_inside_a_transaction_by_its_caller_is_not_handed_out_again(
    database_url: str,
) -> None:
    with kept_connection(database_url) as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()
    # A caller keeping a reference and opening a transaction after its block ended.
    conn.execute("SELECT 1")
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    with kept_connection(database_url) as again:
        assert again is not conn
        assert again.execute("SELECT pg_backend_pid()").fetchone() != first
    assert conn.closed  # closed when it was passed over, not left open in its transaction


def test_a_commit_that_fails_at_the_end_of_a_call_raises_and_keeps_nothing(database_url: str) -> None:
    """A deferred constraint is checked at COMMIT: the error reaches the caller, the
    connection is closed, and the next call gets a new session."""
    with connect(database_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE deferred (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    first = backend(database_url)
    with pytest.raises(psycopg.errors.UniqueViolation), kept_connection(database_url) as conn:
        conn.execute("INSERT INTO deferred VALUES (1), (1)")
    assert conn.closed
    assert backend(database_url) != first
    with connect(database_url) as other:
        assert other.execute("SELECT count(*) FROM deferred").fetchone() == (0,)


def test_a_caller_that_closed_the_connection_itself_gets_no_error(database_url: str) -> None:
    first = backend(database_url)
    with kept_connection(database_url) as conn:
        conn.close()
    assert backend(database_url) != first
