"""The two small real datasets the examples use, shipped in ``examples/data`` (nothing is downloaded).

* ``digits.npz``: the 1,797 8x8 handwritten digits of the UCI "Optical
  Recognition of Handwritten Digits" test set (E. Alpaydin, C. Kaynak, 1998;
  CC BY 4.0), pixel counts 0-16, as scikit-learn bundles them.
* ``iris.csv``: Fisher's 150 iris flowers (R. A. Fisher, 1936; the UCI copy,
  CC BY 4.0): four measures in cm and the species.
"""

from __future__ import annotations

import csv
import os
from typing import List, Tuple

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def load_digits() -> Tuple[np.ndarray, np.ndarray]:
    """``(images, labels)``: uint8 images of shape ``(1797, 8, 8)`` with values 0-16, and their digits."""
    with np.load(os.path.join(DATA, "digits.npz")) as arrays:
        return arrays["images"], arrays["labels"]


def load_iris() -> List[Tuple[float, float, float, float, str]]:
    """The 150 flowers as ``(sepal_length, sepal_width, petal_length, petal_width, species)`` rows."""
    with open(os.path.join(DATA, "iris.csv"), newline="") as table:
        return [(*map(float, row[:4]), row[4]) for row in list(csv.reader(table))[1:]]
