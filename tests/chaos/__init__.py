"""The chaos suite: count_topic under process kills, fail points, database and broker faults.

``python -m tests.chaos --trials 200`` runs the long suite and prints one summary
line; ``test_chaos_quick.py`` is the CI subset. See :mod:`tests.chaos.runner`.
"""
