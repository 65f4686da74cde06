"""The PostgreSQL side: where the truth lives, and the transactions that move it.

Owns connections and their timeouts (:mod:`~txstore.postgres.db`, the driver's reused one in
:mod:`~txstore.postgres.driverdb`), the tables defined once (:mod:`~txstore.postgres.schema`,
Alembic runs them: :mod:`~txstore.postgres.migrate`), the job lock
(:mod:`~txstore.postgres.locks`), reading and starting offsets
(:mod:`~txstore.postgres.store`), the commits themselves: the transactional sink with its
conditional offset update (:mod:`~txstore.postgres.sink`), the idempotent sink
(:mod:`~txstore.postgres.idempotent`) and the outbox (:mod:`~txstore.postgres.outbox`);
and in a folder above the rest, which never imports it, results tables: their flags, type
rules and merge SQL, the catalog checks, rows as ``COPY`` text and the merge
(:mod:`txstore.postgres.results`).

May import: ``txstore.core``, ``txstore.kafka`` (the idempotent sink finds a bad message by
re-reading its range), psycopg and SQLAlchemy; never Spark or the driver.
"""
