"""What a running job tells the people who operate it: log lines and Prometheus metrics.

Owns a batch's report and its log lines (:mod:`~txstore.report.batch_report`), the text and
JSON log formats (:mod:`~txstore.report.logformat`) and the job's Prometheus metrics
(:mod:`~txstore.report.metrics`).

May import: ``txstore.core`` and what a range's report is made of (``txstore.spark``,
``txstore.kafka``); never the driver or ``txstore.ops``.
"""
