"""The sweep binary run as a user runs it, launch to exit, for the sweep benchmarks."""

import json
import os
import subprocess
import sys
import time

from agents.runs import run_config
from agents.storage import locations


def run_sweep(spec_path, output_dir, workers, caller_directory=None, log_path=None):
    """Runs `python -m pipelines.sweep` on `spec_path` into `output_dir` with `workers`
    DirectRunner workers; returns (wall seconds, its records, its stderr).

    Relative paths in the spec are taken from `caller_directory` (default: this process's);
    with `log_path`, the sweep's log is appended there.
    Raises RuntimeError, with the end of the sweep's log, if it fails.
    """
    env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT,
               BUILD_WORKING_DIRECTORY=caller_directory or locations.caller_directory())
    began = time.time()
    result = subprocess.run(
        [sys.executable, '-m', 'pipelines.sweep', f'--spec={spec_path}',
         f'--output_dir={output_dir}', f'--direct_num_workers={workers}'],
        env=env, capture_output=True, text=True, check=False)
    wall_time = time.time() - began
    if log_path:
        with open(log_path, 'a') as f:
            f.write(result.stderr)
    if result.returncode:
        raise RuntimeError(f'the sweep into {output_dir} failed ({result.returncode}):\n'
                           f'{result.stderr[-3000:]}')
    with open(os.path.join(output_dir, 'trials.jsonl')) as f:
        return wall_time, [json.loads(line) for line in f], result.stderr
