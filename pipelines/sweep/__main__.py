"""`python -m pipelines.sweep`: the sweep binary (pipelines/sweep/sweep.py)."""

from pipelines.sweep import sweep

sweep.run()
