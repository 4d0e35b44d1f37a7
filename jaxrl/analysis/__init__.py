"""Analysis of finished runs: learning curves, IQM score tables, bootstrap bands (``jaxrl plot``).

- ``runs``: find run directories, read them, group seeds, the final-score table.
- ``stats``: IQM and percentile-bootstrap confidence intervals (numpy only).
- ``curves``: learning-curve plots (``plot_runs``, which ``jaxrl plot`` calls).

Reads run directories through their files (``metrics.csv``, ``config.json``, ``summary.json``).
May import: ``jaxrl.loops`` (the run directory's logging helpers) and below.
"""

from jaxrl.analysis.runs import Group, Run, final_scores, find_runs, group_runs, load_run
from jaxrl.analysis.stats import bootstrap_ci, iqm

__all__ = [
    "Group",
    "Run",
    "bootstrap_ci",
    "final_scores",
    "find_runs",
    "group_runs",
    "iqm",
    "load_run",
]
