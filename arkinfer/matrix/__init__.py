"""`arkinfer matrix`: one verified, benchmarked artifact per (target, preset) cell.

The matrix table is the `[matrix]` table of each target profile (`targets/*.toml`: the presets CI
ships for that device and the labels of a self-hosted runner that is the device); the CLI and
.github/workflows/artifacts.yml both read it through `select_cells`.

    cells = select_cells("all", "default")            # table.py: Cell(target, preset, ...)
    index = run_matrix("demo", cells, Path("dist"), MatrixSettings(jobs=2))   # run.py

Each cell runs `arkinfer build`, then (for an existing artifact) `arkinfer verify`, then a short
`arkinfer bench`, each as its own process (cell.py), so a crash or a failed gate in one cell never
stops the others. Cells whose backend is not installed here are decided in a second, before any
build (preflight.py). `index.json` (index.py, schema index.schema.json) is rewritten atomically
after every cell, so a killed run resumes; summary.md and summary.png (summary.py) are what a
person reads. Layout of `-o dist`:

    dist/MODEL/index.json  summary.md  summary.png
    dist/MODEL/TARGET.PRESET/             the artifact (arkinfer.json + the backend's files)
    dist/MODEL/TARGET.PRESET.bench.json   `arkinfer bench --json` rows of that artifact
    dist/MODEL/logs/TARGET.PRESET.log     stdout/stderr of the cell's processes
"""

from arkinfer.matrix.run import MatrixSettings, run_matrix
from arkinfer.matrix.table import Cell, select_cells

__all__ = ["Cell", "MatrixSettings", "run_matrix", "select_cells"]
