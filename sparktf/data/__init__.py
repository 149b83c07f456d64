"""The data path: specs, columnar Blocks, their transport and cache, and worker-side batches.

Owns how records become NumPy Blocks (``specs``, ``columnar``), how Blocks
move between the JVM and Python and are cached (``block_serializer``,
``driver_blocks``), where they come from (``sources``, ``arrow_io``,
``tfrecord_io``), the batching rules (``block_dataset``) and the
worker-side batch iterators (``batching``).

May import: ``sparktf.errors``, ``sparktf.spark``. Never ``models``,
``training``, ``inference``, ``launch`` or the public modules.
"""
