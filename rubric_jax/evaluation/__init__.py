"""Benchmark evaluation (experiments.evaluate): one module per benchmark's scoring (hellobench,
longbench_write, healthbench, biggen, rubric_set), the harness that answers, judges and scores
(harness.py), policy loading (policy.py; run directories: rubric_jax/train/runs.py) and the report files (report.py)."""
