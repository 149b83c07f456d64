"""Draw a sparktf step timeline (``TFOptimizer.last_timeline``, Chrome-trace JSON) as an SVG: one row per rank, one
coloured box per phase of each profiled step, the time axis in milliseconds.

``python benchmarks/timeline_svg.py timeline-4-6.json docs/images/timeline.svg``

With ``--record OUT.json`` it first trains a small MLP on ``local[2]`` with
``optimize(profile_steps=(20, 23))``, rank 1 slowed in compute by a hook
layer, and copies the timeline it wrote to ``OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any, Dict, List

COLOURS = {"data": "#8c8c8c", "lookup": "#9467bd", "compute": "#1f77b4", "exchange": "#ff7f0e", "apply": "#2ca02c"}
ROW, TOP, LEFT, WIDTH = 36, 30, 110, 860


def svg(trace: Dict[str, Any]) -> str:
    """The SVG text of ``trace``'s slices."""
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M"}
    ranks = sorted({e["tid"] for e in slices})
    end = max(e["ts"] + e["dur"] for e in slices)
    scale = WIDTH / end
    height = TOP + ROW * len(ranks) + 50
    parts: List[str] = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
                        'font-family="sans-serif" font-size="12">',
                        f'<rect width="100%" height="100%" fill="white"/>']
    for row, rank in enumerate(ranks):
        y = TOP + row * ROW
        parts.append(f'<text x="8" y="{y + 20}">{names.get(rank, f"rank {rank}")}</text>')
        for e in (e for e in slices if e["tid"] == rank):
            x, w = LEFT + e["ts"] * scale, max(e["dur"] * scale, 0.5)
            parts.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{ROW - 10}" '
                         f'fill="{COLOURS.get(e["cat"], "#cccccc")}"><title>{e["name"]} (iteration '
                         f'{e["args"]["iteration"]}): {e["dur"] / 1000:.2f} ms</title></rect>')
    axis = TOP + ROW * len(ranks) + 12
    for tick in range(0, int(end / 1000) + 1, max(1, int(end / 1000 / 8))):
        x = LEFT + tick * 1000 * scale
        parts.append(f'<line x1="{x:.1f}" y1="{axis - 6}" x2="{x:.1f}" y2="{axis}" stroke="black"/>'
                     f'<text x="{x:.1f}" y="{axis + 14}" text-anchor="middle">{tick} ms</text>')
    for i, (phase, colour) in enumerate(COLOURS.items()):
        x = LEFT + i * 120
        parts.append(f'<rect x="{x}" y="6" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{x + 16}" y="16">{phase}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def record(out: str) -> None:
    """Train a small MLP on 2 workers, rank 1 slowed in compute, and copy its timeline to ``out``."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import sparktf
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    class SlowRankOne(keras.layers.Layer):
        def call(self, inputs):
            def wait(values):
                from pyspark import TaskContext

                if TaskContext.get().partitionId() == 1:
                    time.sleep(0.01)
                return values

            out = tf.py_function(wait, [inputs], tf.float32)
            out.set_shape(inputs.shape)
            return out

    sparktf.init_spark("local[2]", app_name="timeline")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8192, 64)).astype(np.float32), rng.normal(size=(8192, 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((64,)), SlowRankOne(), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays((x, y), batch_size=256), num_workers=2)
    optimizer.optimize(MaxIteration(30), verbose=0, profile_steps=(20, 23))
    print(optimizer.stragglers)
    shutil.copy(optimizer.last_timeline, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("svg", nargs="?")
    parser.add_argument("--record", action="store_true", help="train first and write the trace to TRACE")
    args = parser.parse_args()
    if args.record:
        record(args.trace)
    if args.svg:
        with open(args.trace) as source, open(args.svg, "w") as out:
            out.write(svg(json.load(source)))


if __name__ == "__main__":
    main()
