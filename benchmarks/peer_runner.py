"""What the peer runners share: their command line, the check of their settings table and the
lines they write to metrics.jsonl.

The runners (sb3_runner.py, sb3_a2c_runner.py, sb3_sac_runner.py; rejax_runner.py for its
metrics) are scripts of the peers' python (.venv-peers, built by benchmarks/setup_peers.sh),
which finds this module beside them: a script's folder comes first on its sys.path. The A2C
and SAC runners are also imported as benchmarks.sb3_*_runner in the main venv (their settings
checks and translations), so they import this module the way they are loaded:

    if __package__:  # benchmarks.sb3_a2c_runner, imported by the benchmark and its test.
        from benchmarks import peer_runner
    else:  # A script of the peers' python.
        import peer_runner

Hence this module imports only the standard library (numpy only where a record is made, which
only a run does). What the SB3 runners share beyond this (the environments, the evaluator, the
training) needs SB3 and lives in sb3_runner.py.
"""

import argparse
import json
import os

METRICS_FILE = 'metrics.jsonl'  # As agents/runs/run_dir.METRICS_FILE, which peers cannot import.
EVAL_SEED_OFFSET = 1_000_000  # As BatchPPO's trainer: eval envs never share seeds with training.


class UnsupportedSetting(ValueError):
    """A setting the peer cannot run as BatchPPO does; the message names it, `key` too (None
    for missing or unknown keys)."""

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key


def check_keys(settings, keys):
    """Raises UnsupportedSetting unless `settings` has exactly the keys `keys`."""
    missing = [key for key in keys if key not in settings]
    unknown = [key for key in settings if key not in keys]
    if missing or unknown:
        raise UnsupportedSetting(f'settings: missing keys {missing}, unknown keys {unknown}')


def argument_parser(doc):
    """The SB3 runners' command line, described by the first line of `doc`; a runner adds its
    own arguments to it."""
    parser = argparse.ArgumentParser(description=doc.split('\n')[0])
    parser.add_argument('--config', required=True, help='JSON object with the keys of SETTINGS.')
    parser.add_argument('--logdir', required=True)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--torch_threads', type=int, default=1)
    parser.add_argument('--vec_env', choices=('dummy', 'subproc'), default='dummy')
    return parser


def parse_config(parser, argv, check):
    """(args, settings): `argv` (None: sys.argv[1:]) parsed by `parser`, and the settings table
    of its --config. What `check(settings)` refuses (UnsupportedSetting) ends the program as a
    usage error (exit status 2) that names it, before anything is built."""
    args = parser.parse_args(argv)
    settings = json.loads(args.config)
    try:
        check(settings)
    except UnsupportedSetting as error:
        parser.error(f'--config: {error}')
    return args, settings


def evaluation_record(step, returns, lengths, env_steps_per_sec, wall_time_s, **extra):
    """A metrics.jsonl line of an evaluation, with the fields of BatchPPO's trainer (then
    `extra`): the episodes' `returns` and `lengths` after `step` environment steps."""
    import numpy as np

    return {
        'step': step,
        'mean_return': float(np.mean(returns)),
        'std_return': float(np.std(returns)),
        'episodes': len(returns),
        'mean_length': float(np.mean(lengths)),
        'env_steps_per_sec': env_steps_per_sec,
        'wall_time_s': wall_time_s,
        **extra,
    }


def append_metrics(logdir, record):
    """Appends `record` as one JSON line to `logdir`/metrics.jsonl, which the benchmarks poll
    while the run goes (train_throughput.run_monitored)."""
    with open(os.path.join(logdir, METRICS_FILE), 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')
