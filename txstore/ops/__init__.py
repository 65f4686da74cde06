"""The operators' side: the ``txstore`` command and what its subcommands do.

Owns the command line (:mod:`~txstore.ops.cli`: ``status``, ``status --check``, ``jobs``,
``reset``, ``publish``, ``py-files``, ``count-topic``, ``demo``), what ``status`` and its
check gather (:mod:`~txstore.ops.status`), planning a reset (:mod:`~txstore.ops.reset_plan`,
pure) and carrying it out (:mod:`~txstore.ops.reset`) and the demo (:mod:`~txstore.ops.demo`).

May import: everything else of txstore (it is the top layer); nothing imports it but
``txstore.testing``'s command lines and the tests.
"""
