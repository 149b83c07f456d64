"""A driver of its own for ``optimize_stream``, killed with SIGKILL at the worst moment (or not at all).

``python stream_driver.py EVENTS MODEL_DIR KILL_AFTER [--workers N] [--when end|begin|publish]
[--publish-every N] [--master MASTER] [--batch-size B]`` trains the stream of
EVENTS' files (one a micro-batch, ``availableNow``) as ``tests/test_streaming.py``
does, on N workers (default 2 in ``local[2]``: a job per micro-batch; 1 there,
or 2 in ``local[3]``, leaves a slot for a resident job), and SIGKILLs itself
at micro-batch KILL_AFTER (-1: never; then it prints each micro-batch's
progress entry as a ``PROGRESS <json>`` line):

* ``end`` (default): in ``on_epoch_end``, after its checkpoint was written,
  before Spark commits the micro-batch;
* ``begin``: in ``on_epoch_begin``: a resident job's micro-batch is then
  staged, not trained, and not committed;
* ``publish``: while publishing its version (``--publish-every``), after its
  checkpoint and before the version's manifest.
"""

import argparse
import json
import os
import signal
import sys

import keras

import sparktf
from sparktf.models import published
from spark_conf import CONF  # beside this program

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_streaming import classifier, event_stream  # noqa: E402 - the test's model and stream

parser = argparse.ArgumentParser()
parser.add_argument("events")
parser.add_argument("model_dir")
parser.add_argument("kill_after", type=int)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--when", choices=("end", "begin", "publish"), default="end")
parser.add_argument("--publish-every", type=int, default=None)
parser.add_argument("--master", default="local[2]")
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()
events, model_dir, kill_after, when = args.events, args.model_dir, args.kill_after, args.when
spark = sparktf.init_spark(args.master, conf=CONF)
spark.sparkContext.setLogLevel("ERROR")


def die(batch_id, logs):
    if batch_id == kill_after:
        print(f"killing the driver after micro-batch {batch_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


dataset = sparktf.TFDataset.from_dataframe(event_stream(spark, events), "features", "label",
                                           batch_size=args.batch_size, shuffle=False)
optimizer = sparktf.TFOptimizer.from_keras(classifier(), dataset, model_dir=model_dir, num_workers=args.workers)
kill = {"on_epoch_end": die} if when == "end" else {"on_epoch_begin": lambda batch_id: die(batch_id, None)}
if when == "publish":  # the manifest of KILL_AFTER's version is never written
    write_manifest = published._write_manifest
    published._write_manifest = lambda store, path, number, manifest: (
        die(manifest.get("batchId"), None), write_manifest(store, path, number, manifest))[1]
    kill = {}
query = optimizer.optimize_stream(trigger={"availableNow": True}, callbacks=[keras.callbacks.LambdaCallback(**kill)],
                                  publish_every=args.publish_every)
query.awaitTermination(600)
print("the query ended without being killed", flush=True)
for entry in query.training_progress:
    print("PROGRESS", json.dumps(entry), flush=True)
