"""Prints, as one JSON line, the judge block experiments.run resolves from its command line (--config, --judge,
--judge.FIELD, --config.judge.FIELD): `python -m tests.judge_merged --config=configs/tiny.py ...`, run by
tests/experiments/test_judge_config.py through a command server (the imports paid once, not once per case)."""

import json
import sys

from absl import flags

from experiments import judge_config, run

if __name__ == "__main__":
    flags.FLAGS(sys.argv)
    print(json.dumps(judge_config.merged(run._CONFIG.value).judge.to_dict()))
