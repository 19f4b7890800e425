"""Run logdirs for the report's tests: synthesized like the trainer writes them, and damaged.

A synthetic run has the files of a real one (operative_config.gin, metrics.jsonl, TF2 event
files, an exported policy) with chosen returns, so tests know every number the report must
show. The exported policy is copied from one tiny real training run (`train_tiny_policy`),
since only a trained agent can be exported.
"""

import hashlib
import json
import os
import shutil

DEFAULT_BINDINGS = {
    'FeedForwardGaussianPolicy.hidden_sizes': '(64, 64)',
    'PPO.clip_ratio': '0.2',
    'PPO.learning_rate': '0.001',
    'PPO.policy_network': '@FeedForwardGaussianPolicy',
    'train.env_id': "'Pendulum-v1'",
    'train.seed': '0',
    'train.total_steps': '2048',
    'train.wrappers': "('range_normalize', 'ClipAction')",
}


def operative_config(bindings):
    """Gin text laid out as gin's `operative_config_str` writes it."""
    by_configurable = {}
    for name, value in sorted(bindings.items()):
        configurable, _ = name.rsplit('.', 1)
        by_configurable.setdefault(configurable, []).append(f'{name} = {value}')
    sections = []
    for configurable, lines in by_configurable.items():
        sections.append(f'# Parameters for {configurable}:\n# {"=" * 78}\n' + '\n'.join(lines))
    return '\n\n'.join(sections) + '\n'


def make_run(logdir, returns, steps=None, seed=0, bindings=None, train_returns=None,
             metrics=True, events=True, config=True, policy=None):
    """Writes a run that evaluated to `returns` at `steps` (default 256, 512, ...).

    Args:
      bindings: overrides of `DEFAULT_BINDINGS` (value texts as gin writes them).
      train_returns: training-episode returns logged at the same steps (default none).
      metrics, events, config: whether to write metrics.jsonl, event files, the gin file.
      policy: an exported policy directory to copy as the run's latest export.

    Returns:
      `logdir`.
    """
    os.makedirs(logdir, exist_ok=True)
    steps = list(steps or [256 * (i + 1) for i in range(len(returns))])
    if config:
        values = dict(DEFAULT_BINDINGS, **{'train.seed': str(seed)}, **(bindings or {}))
        with open(os.path.join(logdir, 'operative_config.gin'), 'w', encoding='utf-8') as f:
            f.write(operative_config(values))
    if metrics:
        with open(os.path.join(logdir, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
            for step, value in zip(steps, returns, strict=True):
                f.write(json.dumps({'step': step, 'mean_return': value, 'std_return': 0.0,
                                    'episodes': 1, 'mean_length': 200.0}) + '\n')
    if events:
        write_events(logdir, steps, returns, train_returns)
    if policy:
        shutil.copytree(policy, os.path.join(logdir, 'policy', str(steps[-1])))
    return logdir


def write_events(logdir, steps, returns, train_returns=None):
    """TF2 summaries as the trainer writes them; returns the event file's path."""
    import tensorflow as tf

    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        for index, step in enumerate(steps):
            tf.summary.scalar('train/loss', 0.1, step=step)
            if train_returns is not None:
                tf.summary.scalar('train/episode_return', train_returns[index], step=step)
            tf.summary.scalar('eval/mean_return', returns[index], step=step)
    writer.close()
    return event_files(logdir)[-1]


def event_files(logdir):
    return sorted(os.path.join(logdir, name) for name in os.listdir(logdir)
                  if name.startswith('events.out.tfevents.'))


def truncate(path, num_bytes):
    """Cuts the last `num_bytes` bytes off a file, as a crash mid-write leaves it."""
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size - num_bytes)


def corrupt(path, offset):
    """Flips the bits of one byte, as a bad disk would."""
    with open(path, 'r+b') as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def train_tiny_policy(directory):
    """Trains the tiny run of agents/scripts/testing_utils.py, its update without XLA (no
    report is about it); returns its latest policy dir. Grappler stays on: without it, the
    exported policy's returns differed in their last digits between the report's worker
    processes and this one (report_storage_test compares them exactly)."""
    from agents.scripts import testing_utils

    testing_utils.train_tiny_run(directory, bindings='PPO.jit_compile = False')
    return os.path.join(directory, 'policy', '512')


# Final evaluation returns of the synthetic sweep, by learning rate and seed.
SWEEP_FINALS = {'0.001': [-150.0, -170.0, -160.0], '0.01': [-400.0, -300.0, -350.0]}
EVIL_RUN = 'extra/<script>alert(1)</script>'


def make_sweep(root, policy, damaged=True):
    """A sweep's output as pipelines/sweep/sweep.py writes it: trials.jsonl and trials/<id>/.

    Two learning rates x three seeds (`SWEEP_FINALS`), each run with 3 evaluations, training
    returns, and a copy of `policy`. With `damaged`, also what the report must survive:
    a failed trial without a logdir, a run without any evaluation, a truncated event file
    (lr 0.01, seed 1), a corrupt metrics.jsonl line (lr 0.001, seed 2), a run without event
    files (lr 0.01, seed 2), no exported policy for the best run of lr 0.01 (seed 1), and
    outside the sweep a run of lr 0.001 (seed 5, final -165, no policy) named `EVIL_RUN`.
    """
    records = []
    for lr, finals in SWEEP_FINALS.items():
        for seed, final in enumerate(finals):
            trial_id = f'lr{lr}-s{seed}'
            returns = [-1200.0, (final - 1200.0) / 2, final]
            make_run(os.path.join(root, 'trials', trial_id), returns, seed=seed,
                     bindings={'PPO.learning_rate': lr}, policy=policy,
                     train_returns=[value - 50 for value in returns])
            records.append({'id': trial_id, 'bindings': {'PPO.learning_rate': float(lr)},
                            'seed': seed, 'status': 'ok', 'final_return': final,
                            'best_return': final, 'env_steps': 768, 'wall_time_s': 1.0,
                            'error': None})
    if damaged:
        records.append({'id': 'lr0.1-s0', 'bindings': {'PPO.learning_rate': 0.1}, 'seed': 0,
                        'status': 'failed', 'error': 'FloatingPointError: non-finite loss'})
        trials = os.path.join(root, 'trials')
        truncate(event_files(os.path.join(trials, 'lr0.01-s1'))[0], 10)
        with open(os.path.join(trials, 'lr0.001-s2', 'metrics.jsonl'), 'a') as f:
            f.write('{"step": 1024, "mean_re\n')
        for path in event_files(os.path.join(trials, 'lr0.01-s2')):
            os.remove(path)
        shutil.rmtree(os.path.join(trials, 'lr0.01-s1', 'policy'))
        make_run(os.path.join(root, EVIL_RUN), [-1100.0, -165.0], seed=5)
        make_run(os.path.join(root, 'extra', 'no-evaluations'), [], metrics=False, events=False)
    with open(os.path.join(root, 'trials.jsonl'), 'w', encoding='utf-8') as f:
        f.write(''.join(json.dumps(record) + '\n' for record in records))
    return root


# A metrics.jsonl of usable lines (1, 5) and of numbers no training gives, as a bug or damage
# may leave them: a step beyond int64 (line 2), a return next to the float maximum (line 3),
# a boolean step (line 4).
EXTREME_METRICS = [
    {'step': 256, 'mean_return': -800.0},
    {'step': 10**19, 'mean_return': -700.0},
    {'step': 512, 'mean_return': 1.7e308},
    {'step': True, 'mean_return': -600.0},
    {'step': 768, 'mean_return': -200.0},
]
# Runs whose metrics.jsonl is no regular file: their evaluations come from the event files.
SPECIAL_METRICS = ('directory', 'dangling_symlink', 'fifo')


def make_special_metrics(path, kind):
    """Puts at `path` what `kind` names ('directory', 'dangling_symlink' to `path`.gone,
    'fifo', 'device': a link to /dev/null, 'socket') in place of a file."""
    if kind == 'directory':
        os.mkdir(path)
    elif kind == 'dangling_symlink':
        os.symlink(path + '.gone', path)
    elif kind == 'fifo':
        os.mkfifo(path)
    elif kind == 'device':
        os.symlink(os.devnull, path)
    elif kind == 'socket':
        import socket

        # A socket's path is limited to about 100 bytes: it is bound by its name in its folder.
        cwd = os.getcwd()
        os.chdir(os.path.dirname(path))
        try:
            with socket.socket(socket.AF_UNIX) as server:
                server.bind(os.path.basename(path))
        finally:
            os.chdir(cwd)
    else:
        raise ValueError(f'unknown kind {kind!r}')
    return path


def make_extreme_runs(root):
    """Runs the report must survive beside a normal one: `root`/normal, `root`/extreme (its
    metrics.jsonl is `EXTREME_METRICS`) and `root`/special/<kind> for each `SPECIAL_METRICS`
    kind, all of one configuration; each run's event files hold its usable evaluations."""
    make_run(os.path.join(root, 'normal'), [-900.0, -300.0], seed=0)
    extreme = make_run(os.path.join(root, 'extreme'), [-800.0, -200.0], steps=[256, 768],
                       seed=1, metrics=False)
    with open(os.path.join(extreme, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
        f.write(''.join(json.dumps(record) + '\n' for record in EXTREME_METRICS))
    for seed, kind in enumerate(SPECIAL_METRICS, 2):
        logdir = make_run(os.path.join(root, 'special', kind), [-700.0, -100.0 * seed],
                          seed=seed, metrics=False)
        make_special_metrics(os.path.join(logdir, 'metrics.jsonl'), kind)
    return root


# A successive-halving sweep (pipelines/sweep/scheduler.py; η = 2, rungs of 512, 1024 and 2048 env
# steps, metric max mean_return) of four learning rates x two seeds. Each seed's evaluation
# returns at 256, 512, ... up to the budget it was trained to: all four to 512 (rung 0, scores
# -150, -165, -180, -410), the best two to 1024 (rung 1, scores -200, -220), the best one to
# the full 2048. The winner's return falls after 512 steps, so pruned lr 0.01 ends higher
# (-175, -185) and lr 0.003 too (-215, -225) than the winner at the full budget (-240, -260):
# ranked by final return alone, a pruned configuration would come first.
HALVING_BUDGETS = (512, 1024, 2048)
HALVING_RETURNS = {
    '0.001': ([-900.0, -140.0, -170.0, -190.0, -200.0, -220.0, -230.0, -240.0],
              [-900.0, -160.0, -190.0, -210.0, -220.0, -240.0, -250.0, -260.0]),
    '0.003': ([-900.0, -160.0, -200.0, -215.0], [-900.0, -170.0, -210.0, -225.0]),
    '0.01': ([-900.0, -175.0], [-900.0, -185.0]),
    '0.03': ([-900.0, -400.0], [-900.0, -420.0]),
}
# The sweep's id of each learning rate's configuration (as sweep_spec makes them: 8 hex digits).
HALVING_IDS = {lr: hashlib.sha256(f'lr={lr}'.encode()).hexdigest()[:8]
               for lr in HALVING_RETURNS}


def _rung_scores(budget, lrs):
    """{config id: mean over seeds of the return at `budget`} of the learning rates `lrs`."""
    index = budget // 256 - 1
    return {HALVING_IDS[lr]: sum(returns[index] for returns in HALVING_RETURNS[lr]) / 2
            for lr in lrs}


def make_halving_sweep(root, events=True, policy=None):
    """A halving sweep's output as pipelines/sweep/sweep.py writes it (`HALVING_RETURNS`):
    trials.jsonl with each trial's budget, rung, bracket and why it stopped, rungs.jsonl with
    the decisions of rungs 0 and 1, and trials/<id>/ with each run, whose operative config has
    the full budget (the trainer was stopped by --stop_at_step). Returns `root`."""
    decisions, entrants = [], list(HALVING_RETURNS)
    for rung, budget in enumerate(HALVING_BUDGETS[:-1]):
        scores = _rung_scores(budget, entrants)
        promoted = sorted(scores, key=lambda key: (-scores[key], key))[:len(scores) // 2]
        decisions.append({'bracket': 0, 'rung': rung, 'budget': budget,
                          'metric': 'mean_return', 'mode': 'max', 'scores': scores,
                          'promoted': promoted, 'decided_at': 1_700_000_000.0 + rung})
        entrants = [lr for lr in entrants if HALVING_IDS[lr] in promoted]
    records = []
    for config_index, (lr, seeds) in enumerate(HALVING_RETURNS.items()):
        config_id = HALVING_IDS[lr]
        for seed, returns in enumerate(seeds):
            trial_id = f'{config_id}-seed{seed}'
            steps = [256 * (i + 1) for i in range(len(returns))]
            make_run(os.path.join(root, 'trials', trial_id), returns, steps=steps, seed=seed,
                     bindings={'PPO.learning_rate': lr}, events=events, policy=policy,
                     train_returns=[value - 50 for value in returns] if events else None)
            rung = HALVING_BUDGETS.index(steps[-1])
            if rung == len(HALVING_BUDGETS) - 1:
                reason, detail = 'completed', f'trained to the full budget ({steps[-1]} env steps)'
            else:
                decision = decisions[rung]
                order = sorted(decision['scores'], key=lambda key: -decision['scores'][key])
                reason, detail = 'pruned', (
                    f'pruned after rung {rung} ({steps[-1]} env steps): ranked '
                    f'{order.index(config_id) + 1} of {len(order)} by max mean_return; the top '
                    f'{len(decision["promoted"])} went on')
            records.append({
                'id': trial_id, 'config_id': config_id, 'index': config_index * 2 + seed,
                'bindings': {'PPO.learning_rate': float(lr)}, 'seed': seed, 'status': 'ok',
                'final_return': returns[-1], 'best_return': max(returns),
                'env_steps': steps[-1], 'budget': steps[-1],
                'final_metrics': {'mean_return': returns[-1], 'std_return': 0.0,
                                  'mean_length': 200.0},
                'wall_time_s': 1.0, 'error': None, 'logdir': f'trials/{trial_id}',
                'finished_at': 1_700_000_000.0, 'worker': 'host/1', 'rung': rung,
                'bracket': 0, 'stop_reason': reason, 'stop_detail': detail})
    with open(os.path.join(root, 'trials.jsonl'), 'w', encoding='utf-8') as f:
        f.write(''.join(json.dumps(record) + '\n' for record in records))
    with open(os.path.join(root, 'rungs.jsonl'), 'w', encoding='utf-8') as f:
        f.write(''.join(json.dumps(decision) + '\n' for decision in decisions))
    return root


def build_report(root, settings):
    """report.json's content for the runs under `root`, as //pipelines:report builds it but in
    this process and without plots or videos."""
    from pipelines.report import report_data, run_reader

    discovery = run_reader.find_runs(root)
    runs = [run_reader.read_run(logdir, root, trial, settings.ignore_bindings)
            for logdir, trial in discovery.runs]
    groups = {}
    for run in runs:
        if run.error is None:
            groups.setdefault(run.config_key, []).append(run)
    configurations = [report_data.summarize_configuration(key, group, settings)
                      for key, group in sorted(groups.items())]
    return report_data.build_report(runs + discovery.missing, configurations,
                                    discovery.problems, settings, discovery.rungs)
