"""Preparing question data for training (`python -m experiments.prepare_data`).

  pii.py           scrub emails, phones, ID-card, order/account numbers and identifying URLs; counts per kind
  dedup.py         exact and MinHash/LSH near-duplicate removal; exact cross-split leak search
  mix.py           difficulty labels (given, or from a model's rewards), the easy:medium:hard mix, splits
  convert.py       project question jsonl and the public benchmarks -> question rows
  tfds_dataset.py  write the splits as a tensorflow-datasets dataset (array_record) and read them back
  pipeline.py      the steps in order, with the report

RubricRL article §5.1 (questions only, coverage, 3:5:2 difficulty, dedup, PII) and QuRL §4 (benchmarks).
"""
