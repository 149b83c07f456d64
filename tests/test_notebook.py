"""examples/notebook.ipynb runs top to bottom in a fresh Jupyter kernel of this interpreter."""

import json
import os
import sys

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "notebook.ipynb")
KERNEL_NAME = "sparktf-test-python"


def install_kernelspec(jupyter_dir):
    """A kernelspec under ``jupyter_dir`` that runs ipykernel with this test's interpreter."""
    kernel_dir = jupyter_dir / "kernels" / KERNEL_NAME
    kernel_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "sparktf tests", "language": "python"}
    (kernel_dir / "kernel.json").write_text(json.dumps(spec))


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_notebook_trains_evaluates_and_predicts(tmp_path, monkeypatch):
    install_kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("MASTER", "local[2]")
    # the notebook's folder is on a kernel's path when Jupyter is started there (the test runs it in tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.path.join(ROOT, "examples"),
                                                                   os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, kernel_name=KERNEL_NAME, timeout=240, startup_timeout=60,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()

    printed = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for output in cell.outputs)
    assert "validation accuracy per epoch:" in printed
    accuracy = float(printed.split("TFPredictor accuracy on 297 held-out digits: ")[1].split()[0])
    assert accuracy >= 0.97  # what a newcomer sees on digits (about 0.99; the run is seeded)
