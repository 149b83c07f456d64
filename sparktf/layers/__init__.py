"""Keras 3 layers for recommendation models (TensorFlow backend).

* :class:`DynamicEmbedding`: an embedding table that gives rows to the ids
  it sees (int, int64 or string, of any value) up to a capacity, with a
  small hashed fallback table for the others, and optional eviction;
* :class:`DynamicEmbeddingEviction`: the Keras callback that evicts at each
  epoch end of ``model.fit``.

``DynamicEmbedding`` is a registered Keras serializable
(``sparktf>DynamicEmbedding``): a model holding one saves and loads with
``keras.saving`` once this package is imported. This package is a low
layer: it imports only ``sparktf.errors``, TensorFlow, Keras and NumPy.
"""

from sparktf.layers.dynamic_embedding import DynamicEmbedding, DynamicEmbeddingEviction

__all__ = ["DynamicEmbedding", "DynamicEmbeddingEviction"]
