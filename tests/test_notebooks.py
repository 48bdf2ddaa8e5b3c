"""The notebooks run: every code cell of each notebook, in order, in one namespace (as a kernel
would), with a non-interactive plotting backend. Their own asserts (the speculative output
equals the plain output) are part of the test."""

from __future__ import annotations

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_is_a_quickstart():
    assert "quickstart.ipynb" in [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, smollm2_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code
    namespace: dict = {"__name__": "__main__"}
    for i, cell in enumerate(code):
        src = "".join(cell["source"])
        exec(compile(src, f"{path.name} cell {i}", "exec"), namespace)
    import matplotlib.pyplot as plt

    plt.close("all")
