"""A driver of its own for ``optimize_stream``, killed with SIGKILL at the worst moment.

``python stream_driver.py EVENTS MODEL_DIR KILL_AFTER [WORKERS [WHEN [PUBLISH_EVERY]]]`` trains
the stream of EVENTS' files (one a micro-batch, ``availableNow``) as
``tests/test_streaming.py`` does, on WORKERS workers (default 2: a job per
micro-batch; 1 leaves a slot for a resident job), and SIGKILLs itself in
``on_epoch_end`` of micro-batch KILL_AFTER (WHEN ``end``, the default): after
its checkpoint was written, before Spark commits the micro-batch. With WHEN
``begin`` it dies in ``on_epoch_begin``: a resident job's micro-batch is then
staged, not trained, and not committed. With WHEN ``publish`` it dies while
publishing that micro-batch's version (``publish_every=PUBLISH_EVERY``),
after its checkpoint and before the version's manifest.
"""

import os
import signal
import sys

import keras

import sparktf
from sparktf.models import published
from spark_conf import CONF  # beside this program

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_streaming import classifier, event_stream  # noqa: E402 - the test's model and stream

events, model_dir, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
workers, when = (int(sys.argv[4]) if len(sys.argv) > 4 else 2), (sys.argv[5] if len(sys.argv) > 5 else "end")
publish_every = int(sys.argv[6]) if len(sys.argv) > 6 else None
spark = sparktf.init_spark("local[2]", conf=CONF)
spark.sparkContext.setLogLevel("ERROR")


def die(batch_id, logs):
    if batch_id == kill_after:
        print(f"killing the driver after micro-batch {batch_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


dataset = sparktf.TFDataset.from_dataframe(event_stream(spark, events), "features", "label", batch_size=64,
                                           shuffle=False)
optimizer = sparktf.TFOptimizer.from_keras(classifier(), dataset, model_dir=model_dir, num_workers=workers)
kill = {"on_epoch_end": die} if when == "end" else {"on_epoch_begin": lambda batch_id: die(batch_id, None)}
if when == "publish":  # the manifest of KILL_AFTER's version is never written
    write_manifest = published._write_manifest
    published._write_manifest = lambda store, path, number, manifest: (
        die(manifest.get("batchId"), None), write_manifest(store, path, number, manifest))[1]
    kill = {}
query = optimizer.optimize_stream(trigger={"availableNow": True}, callbacks=[keras.callbacks.LambdaCallback(**kill)],
                                  publish_every=publish_every)
query.awaitTermination(600)
print("the query ended without being killed", flush=True)
