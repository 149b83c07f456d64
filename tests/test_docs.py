"""The documentation site builds with mkdocs in strict mode (a warning, e.g. a broken link or a bad
docstring reference, fails the build) and its API reference is generated from the docstrings."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_site_builds_without_warnings(tmp_path):
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "WARNING" not in build.stderr, build.stderr
    reference = (site / "reference.html").read_text()
    for documented in ("TFOptimizer", "from_keras", "from_tfrecord_file", "predict_dataframe", "MaxEpoch",
                       "CollectiveError", "init_spark"):
        assert documented in reference, f"{documented} missing from the API reference"
    for page in ("index.html", "concepts.html", "guides/cluster.html", "migration.html", "troubleshooting.html"):
        assert (site / page).is_file(), page
