"""Embedding tables: how their updates are built, and tables sharded across the workers
(see ``docs/design/sharded-tables.md``).

``update_form``, ``sparse_kernels``, ``compiled_update``: how a table's rows are
updated (the optimizer probed once on the driver for its form, the native row
kernels, the compiled update of padded rows); ``row_sums``: row gradients
summed by id; ``plan``: which tables are sharded, which rows each rank owns
(pure, no Spark); ``lookups``: how a table's ids reach it; ``sharded_tables``: a rank's
shards, looked up and updated each step; ``optimizer_state_store``: their
optimizer state in files between segments; ``sharded_evaluation``: an
evaluation task's batch of rows; ``strategy``: replicated or sharded, as one
``TableStrategy`` on the driver (its optimizer, states and checkpoints). Below
the worker's and the driver's sides, which both use it. The Keras internals
all of this reads are in ``sparktf.models.keras_internals``.
"""
