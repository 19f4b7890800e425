r"""Atari PPO training speed: BatchPPO on configs/atari_pong.gin against CleanRL's
`ppo_atari_envpool.py` with the same settings (issue 41).

Both train PPO on EnvPool's Pong-v5 (episodic life, rewards clipped; 8 envs x 128 steps, 4
epochs of 4 minibatches, the Nature CNN shared by actor and critic, learning rate 2.5e-4):
ours through the train binary, CleanRL's script through benchmarks/cleanrl_atari_runner.py
under the peers' python (.venv-peers, built by benchmarks/setup_peers.sh, which this binary runs
first unless --peers_python is given). CleanRL's settings are read from the gin configuration
and passed as its flags (`cleanrl_args`); what CleanRL's script cannot run as ours does is
refused, naming the setting.

Runs go one at a time, alternated: ours, CleanRL, ours, CleanRL... (`--pairs` pairs), each
monitored as train_throughput's are (peak PSS, CPU seconds of the process tree). Each runs
`--steps` steps; its steady speed is its steps per second between the end of the first
iteration at or past `--warmup_steps` (start-up, tracing and compilation, torch's first passes
left out) and the end of its last iteration, by the wall clock (see progress_speed.py: ours from
its progress lines, with no evaluation in the window; CleanRL from the iteration ends its runner
records). Printed: each pair's speeds and ratio, the medians and the ratio's median with its
spread (min to max over the pairs), and the load average at each run's start.

Threads: CleanRL runs with `torch.set_num_threads(--torch_threads)` (2, the machine's cores);
ours with the config's `configure_threads` (one inter-op thread, intra-op threads as many as the
cores: 2). EnvPool's own threads are its default on both sides. CleanRL's runs get
`OMP_WAIT_POLICY=PASSIVE` (`--omp_wait_policy`): with torch's default, its two OpenMP threads
spin while they wait for each other, and when any other process wants a core (this VM is shared)
an iteration takes several times as long (7 Dec, load 5: 15 to 24 s an iteration with the
default, 4.3 s passive, 4.1 s with one thread; benchmarks/README.md, "Atari PPO"). Ours is
left as a run has it.

`--phases` (default on) then splits an iteration of each into the rollout (the policy's steps
and the environment's steps in it) and the update: CleanRL's from the timers of its runs
(medians over their iterations after the warm-up), ours measured in this process after the runs
(`time_our_phases`: the compiled iteration, the rollout alone, the policy's 128 steps alone, the
environments' 128 steps alone through EnvPoolBatchEnv, the update alone; medians of
`--phase_repeats`).

Example (3 pairs of 32,768 steps, about 15 minutes on 2 cores):

    PYTHONPATH=. .venv/bin/python -m benchmarks.atari_throughput --pairs=3 --steps=32768
"""

import json
import os
import statistics
import tempfile
import time

import gin
from absl import app, flags

from agents.runs import run_config
from benchmarks import progress_speed, train_throughput

# train_throughput's flags serve here too: --gin_bindings (added to the config's; CleanRL gets
# the resulting settings), --workdir, --output_json, --peers_python, --poll_secs. Its others
# (--tasks, --systems, --seeds, --budget, --baseline_tree, --sb3_*) are refused.
flags.adopt_module_key_flags(train_throughput)
flags.DEFINE_string('gin_file', 'configs/atari_pong.gin', 'Our config of the task.')
flags.DEFINE_integer('pairs', 3, 'Pairs of runs (ours, then CleanRL).')
flags.DEFINE_integer('steps', 32768, 'Environment steps of each run.')
flags.DEFINE_integer('warmup_steps', 4096, 'Iterations that end before this step are left out '
                     'of the steady speed.')
flags.DEFINE_integer('seed', 1, 'Seed of every run (CleanRL\'s default).')
flags.DEFINE_integer('torch_threads', 2, 'torch.set_num_threads of CleanRL\'s runs.')
flags.DEFINE_string('omp_wait_policy', 'PASSIVE', 'OMP_WAIT_POLICY of CleanRL\'s runs (\'\': '
                    'torch\'s default, whose threads spin while they wait; see the module '
                    'docstring).')
flags.DEFINE_bool('phases', True, 'After the runs, split an iteration of each side into '
                  'rollout (policy, environments) and update.')
flags.DEFINE_integer('phase_repeats', 5, 'Timed repetitions of each of our phases.')
FLAGS = flags.FLAGS

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, 'cleanrl_atari_runner.py')
# What CleanRL's script fixes: Adam's epsilon, the Nature CNN torso shared by both heads, and
# EnvPool's Atari preprocessing with episodic life and clipped rewards (which our Atari training
# adds too, agents/tools/envpool_atari.py).
REQUIRED = {
    'train.env_backend': 'envpool',
    'train.wrappers': (),
    'train.env_kwargs': None,
    'PPO.objective': 'clipped',
    'PPO.policy_network': 'SharedTorsoCategoricalPolicy',
    'PPO.value_network': None,
    'PPO.adam_epsilon': 1e-5,
    'PPO.early_stop_kl': None,
    'PPO.normalize_observ': False,
    'PPO.scale_reward': False,
    'SharedTorsoCategoricalPolicy.torso': 'NatureCNN',
}


# EnvPool arguments of ours that CleanRL's side does without: stepping in groups.
PIPELINING = ('batch_size',)


class UnsupportedSetting(ValueError):
    """A setting of our config that CleanRL's script cannot run."""


def _reader(name):
    """`read(parameter)` of the configurable `name` in the loaded gin configuration (else the
    default of its signature)."""
    from agents.algorithms import shared_torso  # noqa: PLC0415 - imports TensorFlow.
    from agents.algorithms.ppo import ppo  # noqa: PLC0415
    from agents.runs import run_settings  # noqa: PLC0415

    functions = {'train': run_settings.RunSettings, 'PPO': ppo.PPO.__init__,
                 'SharedTorsoCategoricalPolicy':
                     shared_torso.SharedTorsoCategoricalPolicy.__init__}
    return train_throughput.gin_reader(name, functions[name])


def cleanrl_args(gin_files, bindings):
    """{CleanRL flag: value} of our configuration (`gin_files` and `bindings`, the budget
    included); raises UnsupportedSetting for what CleanRL's script cannot express."""
    from agents.algorithms import registry  # noqa: F401, PLC0415 - registers the configurables.

    run_config.load(gin_files, bindings)
    try:
        read = {name: _reader(name) for name in ('train', 'PPO', 'SharedTorsoCategoricalPolicy')}

        def value(key):
            configurable, parameter = key.split('.')
            found = read[configurable](parameter)
            return tuple(found) if isinstance(found, list) else found

        for key, expected in REQUIRED.items():
            found = value(key)
            if key == 'train.env_kwargs':
                # Ours may step in groups (EnvPool's async mode, the same transitions); CleanRL
                # steps its pool in sync mode, as its script does.
                found = {name: setting for name, setting in dict(found or {}).items()
                         if name not in PIPELINING} or None
            if found != expected:
                raise UnsupportedSetting(f'{key} = {found!r}: CleanRL\'s ppo_atari_envpool.py '
                                         f'runs only {expected!r}')
        clip_ratio, value_clip = value('PPO.clip_ratio'), value('PPO.value_clip')
        if value_clip not in (None, clip_ratio):
            raise UnsupportedSetting(f'PPO.value_clip = {value_clip!r}: CleanRL clips the value '
                                     f'by its clip_coef, PPO.clip_ratio = {clip_ratio!r}, or not')
        num_envs, rollout = value('train.num_envs'), value('train.rollout_length')
        if (num_envs * rollout) % value('PPO.num_minibatches'):
            raise UnsupportedSetting('train.num_envs x train.rollout_length must be a multiple '
                                     'of PPO.num_minibatches, as CleanRL splits its batch')
        return {
            'env-id': value('train.env_id'),
            'total-timesteps': value('train.total_steps'),
            'num-envs': num_envs,
            'num-steps': rollout,
            'anneal-lr': value('train.anneal_learning_rate'),
            'update-epochs': value('PPO.num_epochs'),
            'num-minibatches': value('PPO.num_minibatches'),
            'learning-rate': value('PPO.learning_rate'),
            'gamma': value('PPO.discount'),
            'gae-lambda': value('PPO.gae_lambda'),
            'clip-coef': clip_ratio,
            'clip-vloss': value_clip is not None,
            'ent-coef': value('PPO.entropy_coef'),
            'vf-coef': value('PPO.value_coef'),
            'max-grad-norm': value('PPO.max_grad_norm'),
            'norm-adv': value('PPO.normalize_advantages'),
        }
    finally:
        gin.clear_config()


def torso_dtype(gin_files, bindings):
    """What our Nature CNN computes in under `gin_files` and `bindings`, 'auto' resolved on this
    machine (conv_torsos.resolve_compute_dtype): 'float32' as CleanRL, or 'bfloat16'."""
    from agents.algorithms import conv_torsos, registry  # noqa: F401, PLC0415 - TensorFlow.

    run_config.load(gin_files, bindings)
    try:
        read = train_throughput.gin_reader('NatureCNN', conv_torsos.NatureCNN.__init__)
        return conv_torsos.resolve_compute_dtype(read('compute_dtype')).name
    finally:
        gin.clear_config()


def cleanrl_command(python, args, metrics_file, seed, warmup_steps, torch_threads):
    """The peers' `python` running cleanrl_atari_runner.py with `args` ({flag: value})."""
    return ([python, RUNNER] + [f'--{flag}={value}' for flag, value in args.items()] +
            [f'--seed={seed}', f'--warmup-steps={warmup_steps}',
             f'--torch-threads={torch_threads}', f'--metrics-file={metrics_file}'])


def cleanrl_speeds(metrics, warmup_steps):
    """{'wall': steady steps/s, 'phases': medians of [rollout, act, env, update] seconds over
    the iterations after the warm-up} of a CleanRL runner's metrics file's contents."""
    ends = [tuple(end) for end in metrics['iteration_ends']]
    after = [phase for end, phase in zip(ends, metrics['phases'], strict=True)
             if end[0] > warmup_steps]
    return {'wall': progress_speed.steady_speed(ends, warmup_steps), 'points': len(ends),
            'phases': [statistics.median(column) for column in zip(*after, strict=True)]
            if after else None}


def time_our_phases(gin_files, bindings, repeats):
    """Medians over `repeats` of the seconds of our iteration's parts, in this process:
    'iteration' (the compiled call of one iteration, as training runs it), 'rollout' (the
    simulator's rollout alone: policy and environments), 'act' (the policy's steps of the
    rollout alone: `act` on the same frames in one compiled loop), 'env' (the environments'
    steps alone: EnvPoolBatchEnv.step from Python with random actions, finished ones reset as
    the simulator resets them) and 'update' (`learn` alone on a rollout's batch)."""
    import numpy as np  # noqa: PLC0415 - TensorFlow and its company, only here.
    import tensorflow as tf  # noqa: PLC0415

    from agents.algorithms import registry  # noqa: F401, PLC0415
    from agents.runs import loop, run_settings  # noqa: PLC0415

    run_config.load(gin_files, bindings)
    run_settings.configure_threads()

    def median_seconds(function):
        function()  # Traces and warms up.
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            function()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    with tempfile.TemporaryDirectory() as logdir, \
            loop.training_run(os.path.join(logdir, 'run')) as run:
        step, agent = run.training_step, run.agent
        num_envs, length = run.settings.num_envs, run.settings.rollout_length
        vector_env = run._train_env.vector_env.unwrapped  # noqa: SLF001 - the EnvPoolBatchEnv.
        step(True, 1)  # Resets the environments.
        rollout = tf.function(lambda: step.rollout(reset=False), autograph=False)
        frames = tf.constant(vector_env.reset()[0])
        state = agent.initial_state(num_envs)
        no_reset = tf.zeros([num_envs], tf.bool)

        @tf.function(autograph=False)
        def act():
            def body(index, total):
                action, _, _ = agent.act(frames, state, no_reset)
                return index + 1, total + tf.reduce_sum(tf.cast(action, tf.float32))
            return tf.while_loop(lambda index, _: index < length, body, (0, 0.0),
                                 parallel_iterations=1)

        rng = np.random.default_rng(0)
        space = vector_env.single_action_space

        def env():
            for _ in range(length):
                _, _, terminated, truncated, _ = vector_env.step(
                    rng.integers(0, space.n, num_envs).astype(space.dtype))
                done = terminated | truncated
                if done.any():
                    vector_env.reset(options={'reset_mask': done})

        vector_env.reset()
        result = {'iteration': median_seconds(lambda: step(False, 1)),
                  'rollout': median_seconds(lambda: tf.nest.map_structure(
                      lambda tensor: tensor.numpy(), rollout())),
                  'act': median_seconds(lambda: act()[1].numpy()),
                  'env': median_seconds(env)}
        transitions = rollout()
        batch = {name: getattr(transitions, name) for name in (
            'observ', 'action', 'reward', 'terminated', 'truncated', 'next_observ', 'extras')}
        learn = tf.function(lambda: agent.learn(batch, tf.ones([agent.num_members], tf.bool)),
                            autograph=False)
        result['update'] = median_seconds(lambda: tf.nest.map_structure(
            lambda tensor: tensor.numpy(), learn()))
    gin.clear_config()
    return result


def _check_flags(argv):
    progress_speed.check_flags(argv, FLAGS, progress_speed.TRAIN_THROUGHPUT_ONLY)
    if FLAGS.pairs < 1 or FLAGS.steps < 1 or FLAGS.warmup_steps < 0:
        raise app.UsageError('--pairs and --steps must be positive, --warmup_steps >= 0')


def format_report(runs, phases=None):
    """The table of the pairs, the medians and the ratios, and the phases if given."""
    lines = ['pair  ours steady/s (train clock)  CleanRL steady/s  ours/CleanRL  loads']
    pairs = sorted({run['pair'] for run in runs})
    ratios = []
    for pair in pairs:
        ours = next(run for run in runs if run['pair'] == pair and run['system'] == 'ours')
        peer = next((run for run in runs if run['pair'] == pair and run['system'] == 'cleanrl'),
                    None)
        ratio = ours['wall'] / peer['wall'] if peer and peer['wall'] and ours['wall'] else None
        ratios.append(ratio)
        lines.append(f'{pair:4d}  {_number(ours["wall"]):>13} ({_number(ours["train"])})  '
                     f'{_number(peer and peer["wall"]):>16}  {_number(ratio, 2):>12}  '
                     f'{ours["load_before"]:.1f}, {peer["load_before"] if peer else 0:.1f}')
    lines.append(f'median: ours {progress_speed.spread([r["wall"] for r in runs if r["system"] == "ours"], 0)}, '  # noqa: E501
                 f'CleanRL {progress_speed.spread([r["wall"] for r in runs if r["system"] == "cleanrl"], 0)}; '  # noqa: E501
                 f'ours/CleanRL {progress_speed.spread(ratios)} (median of the pairs\' ratios, '
                 'min to max)')
    if phases:
        lines.append('seconds per iteration: system  iteration  rollout (act, env)  update')
        for system, values in phases.items():
            lines.append(f'  {system}: {_number(values.get("iteration"), 3)}  '
                         f'{_number(values.get("rollout"), 3)} ({_number(values.get("act"), 3)}, '
                         f'{_number(values.get("env"), 3)})  {_number(values.get("update"), 3)}')
    return '\n'.join(lines)


def _number(value, digits=0):
    return '-' if value is None else f'{value:,.{digits}f}'


def main(argv):
    _check_flags(argv)
    gin_files = [run_config.find_gin_file(FLAGS.gin_file)]
    bindings = list(FLAGS.gin_bindings) + progress_speed.ours_bindings(FLAGS.steps)
    try:
        args = cleanrl_args(gin_files, bindings)
    except (UnsupportedSetting, run_config.ConfigError) as error:
        raise app.UsageError(str(error)) from error
    dtype = torso_dtype(gin_files, bindings)
    print(f'settings: {json.dumps(args)}; our torso computes in {dtype}, CleanRL\'s in float32',
          flush=True)
    python = train_throughput.peers_python()
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='atari_throughput-')
    ours_env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)
    peers_env = {key: value for key, value in os.environ.items()
                 if key not in ('PYTHONPATH', 'OMP_WAIT_POLICY')}
    if FLAGS.omp_wait_policy:
        peers_env['OMP_WAIT_POLICY'] = FLAGS.omp_wait_policy
    runs = []
    for pair in range(FLAGS.pairs):
        for system in ('ours', 'cleanrl'):
            logdir = os.path.join(workdir, f'pair{pair}-{system}')
            if system == 'ours':
                command = train_throughput.ours_command(gin_files, bindings, logdir, FLAGS.seed)
                monitored = train_throughput.run_monitored(
                    command, logdir, ours_env, FLAGS.poll_secs, cwd=run_config.PACKAGE_ROOT)
                with open(logdir + '.log', encoding='utf-8') as f:
                    speeds = progress_speed.ours_speeds(f.read(), FLAGS.warmup_steps)
            else:
                metrics_file = logdir + '.json'
                command = cleanrl_command(python, args, metrics_file, FLAGS.seed,
                                          FLAGS.warmup_steps, FLAGS.torch_threads)
                monitored = train_throughput.run_monitored(command, logdir, peers_env,
                                                           FLAGS.poll_secs)
                with open(metrics_file, encoding='utf-8') as f:
                    speeds = cleanrl_speeds(json.load(f), FLAGS.warmup_steps)
            monitored.pop('evals')
            run = dict(monitored, **speeds, system=system, pair=pair, logdir=logdir)
            runs.append(run)
            print(f'pair {pair} {system}: steady {_number(run["wall"])} steps/s'
                  + (f' (training clock {_number(run["train"])})' if 'train' in run else '')
                  + f', {run["wall_s"]:.0f} s launch to exit, peak PSS '
                  f'{run["peak_pss_mb"]:.0f} MB, CPU {run["cpu_s"]:.0f} s, load '
                  f'{run["load_before"]:.1f}', flush=True)
    phases = None
    if FLAGS.phases:
        peer = [run['phases'] for run in runs if run['system'] == 'cleanrl' and run['phases']]
        ours = time_our_phases(gin_files, bindings, FLAGS.phase_repeats)
        phases = {'ours': ours}
        if peer:
            rollout, act, env, update = (statistics.median(column)
                                         for column in zip(*peer, strict=True))
            phases['cleanrl'] = {'iteration': rollout + update, 'rollout': rollout, 'act': act,
                                 'env': env, 'update': update}
    print(format_report(runs, phases))
    print(f'{progress_speed.now()}; load average (1 min) at the runs\' starts '
          f'{min(run["load_before"] for run in runs):.1f} to '
          f'{max(run["load_before"] for run in runs):.1f} on {os.cpu_count()} CPUs')
    if FLAGS.output_json:
        with open(FLAGS.output_json, 'w', encoding='utf-8') as f:
            json.dump({'settings': args, 'torso_dtype': dtype, 'runs': runs, 'phases': phases,
                       'omp_wait_policy': FLAGS.omp_wait_policy,
                       'torch_threads': FLAGS.torch_threads}, f, indent=1)


if __name__ == '__main__':
    app.run(main)
