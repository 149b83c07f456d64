"""Embedding tables sharded across the training workers (see ``docs/design/sharded-tables.md``).

``plan``: which tables, which rows each rank owns (pure, no Spark); ``lookups``: how a table's ids reach it;
``tables``: a rank's shards, looked up and updated each step; ``slot_store``: their optimizer slots in files
between segments; ``driver_tables``: the driver's optimizer and states without those slots.
"""
