"""Embedding tables sharded across the training workers (see ``docs/design/sharded-tables.md``).

``plan``: which tables, which rows each rank owns (pure, no Spark).
"""
