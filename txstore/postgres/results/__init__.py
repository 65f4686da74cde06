"""Results tables: a table of the user's own, merged into by rules, committed with the offsets.

Owns a results table's flags, key, merge rules and type rules, and the merge SQL
(:mod:`~txstore.postgres.results.results_table`), the start-up check of the table against the
catalog and the query (:mod:`~txstore.postgres.results.results_check`), rows as ``COPY`` text
(:mod:`~txstore.postgres.results.copy_text`), and copying and merging a batch's rows in the same
transaction as its offsets, or finding the rows PostgreSQL refuses
(:mod:`~txstore.postgres.results.results_merge`).

Above the sink's conditional offset update (:mod:`txstore.postgres.sink`); nothing else in
``txstore.postgres`` imports it. May import the rest of ``txstore.postgres``, ``txstore.core``,
``txstore.kafka`` and psycopg; never Spark or the driver.
"""
