"""Synchronous data-parallel training, in three parts over the state they share.

``checkpoint`` (model state and its files), ``metric_state`` (metrics'
state variables), ``state_source`` (how a task gets the state to start
from) and ``clipping`` (of the global gradient) are shared; :mod:`~sparktf.training.tables` builds table updates and
shards tables; :mod:`~sparktf.training.worker` runs inside the barrier tasks;
:mod:`~sparktf.training.driver` runs a training call from the driver and
starts the worker's loop in its jobs. Imports go down that list only.

May import: ``sparktf.errors``, ``sparktf.triggers``, ``sparktf.spark``,
``sparktf.collective``, ``sparktf.data``, ``sparktf.models``. Never the
public modules (``sparktf.optimizer``, ...).
"""
