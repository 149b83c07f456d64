"""Synchronous data-parallel training: the barrier tasks' loop and the driver's segment jobs.

Owns one iteration as a step and an update call (``step``), a segment's loop inside a
barrier task (``loop``), starting a segment's barrier job from the driver
(``segment_job``), model state and checkpoints (``checkpoint``), and
record-weighted distributed evaluation (``evaluation``).

May import: ``sparktf.errors``, ``sparktf.triggers``, ``sparktf.spark``,
``sparktf.collective``, ``sparktf.data``, ``sparktf.models``. Never the
public modules (``sparktf.optimizer``, ...).
"""
