"""Training from Structured Streaming: ``TFOptimizer.optimize_stream``'s query and its micro-batches.

``query`` checks the settings and starts a ``foreachBatch`` query on the
streaming dataset's DataFrame; ``micro_batches`` is what runs for each
micro-batch on the driver: skip one trained before, test, train one pass,
commit the checkpoint with the micro-batch's id, publish a version. A public
layer: it drives ``TFOptimizer`` and ``TFDataset``. See ``docs/guides/streaming.md``.
"""
