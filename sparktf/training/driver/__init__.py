"""The driver's side of training: what ``TFOptimizer`` hands a training call to.

``session``: the model, where training stands, its payload and tables, which
every training call goes through (:class:`TrainingSession`); ``run``: a
training call, segment by segment (:class:`TrainingRun`), and the driver's
evaluation; ``segment_job``: one segment's barrier job and its relaunch;
``membership``: the workers of a call, elastic ones included; ``watchdog``:
the job channel's reports, stalls and failures; ``preflight``: the checks
before any job; ``checkpoint_writer``: a call's checkpoints, written between
segments (a failed write warns; ``checkpoint_failures`` in a row stop it);
``resident_job``: a stream's training job that lives across micro-batches;
``callbacks``, ``progress`` and ``anatomy``: what a call reports (Keras
callbacks, the progress display, stragglers); ``evaluation``: record-weighted evaluation as a job; ``inputs``:
a call's training layout of the data.

This package is the only part of :mod:`sparktf.training` the public modules
need; its names below are that surface.
"""

from sparktf.training.checkpoint import (find_checkpoint, latest_checkpoint, load_checkpoint, prune_checkpoints,
                                        write_checkpoint)
from sparktf.training.clipping import GradientClipping
from sparktf.training.driver.callbacks import default_verbose
from sparktf.training.driver.preflight import (check_labels, check_membership, check_optimize, check_settings,
                                               checked_profile_steps, compile_with_loss, recompile)
from sparktf.training.driver.evaluation import metrics_of_totals
from sparktf.training.driver.resident_job import PassResult, ResidentJob
from sparktf.training.driver.run import RunRequest, RunSettings, RunState, TrainingRun, evaluate_model
from sparktf.training.driver.session import TrainingSession
from sparktf.training.tables.strategy import TableStrategy
from sparktf.training.tables.update_form import log_table_updates
from sparktf.training.worker.resident import TEST_BATCH_FACTOR
from sparktf.training.worker.segment_spec import SegmentSpec
from sparktf.training.batch_schedule import SinglePass

__all__ = ["GradientClipping", "PassResult", "ResidentJob", "RunRequest", "RunSettings", "RunState", "SegmentSpec",
           "SinglePass", "TEST_BATCH_FACTOR", "TableStrategy", "TrainingRun", "TrainingSession", "metrics_of_totals",
           "check_labels", "check_membership", "check_optimize", "check_settings", "checked_profile_steps",
           "compile_with_loss", "default_verbose", "evaluate_model", "find_checkpoint", "latest_checkpoint",
           "load_checkpoint", "log_table_updates", "prune_checkpoints", "recompile", "write_checkpoint"]
