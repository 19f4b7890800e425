"""`python -m pipelines.report`: the report binary (pipelines/report/report.py)."""

from pipelines.report import report

report.run()
