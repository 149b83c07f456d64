"""Optimizers for recommendation models' embedding tables (Keras 3, TensorFlow backend).

* :class:`RowWiseAdagrad`: Adagrad with one accumulator value per table row
  (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``);
* :class:`LazyAdam`: Adam whose sparse updates touch only the rows in the
  batch (TF Addons' LazyAdam; not equivalent to Adam on sparse data).

Both are registered Keras serializables (``sparktf>RowWiseAdagrad``,
``sparktf>LazyAdam``): a model compiled with one saves and loads with
``keras.saving`` once this package is imported. This package is a low
layer: it imports only TensorFlow and Keras.
"""

from sparktf.optimizers.lazy_adam import LazyAdam
from sparktf.optimizers.row_wise_adagrad import RowWiseAdagrad

__all__ = ["LazyAdam", "RowWiseAdagrad"]
