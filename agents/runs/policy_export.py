"""A run's policy as a self-contained SavedModel: serve it with TensorFlow alone.

An exported policy holds the policy network and the observation normalizer (raw environment
observations go in) and two signatures:

  deterministic_action(observ [B, *observ_shape] float32, or uint8 frames for a policy that
    takes frames) -> {'action'}: the distribution's mode, what evaluation uses;
  sampled_action(observ) -> {'action'}: a sample, drawn with a random generator stored in the
    model (its state advances with every call).

Recurrent policies take and return their state: both signatures are then
`(observ, state [B, *state_shape], reset [B] bool) -> {'action', 'state'}`, where `reset` zeroes
the state of episodes that start at this step, and `initial_state(batch_size)` -> {'state'}
gives the state of new episodes. Actions live in the action space of the *wrapped* environment
the policy was trained in: with the default wrappers, rescaled to [-1, 1] and not yet clipped
(the ClipAction wrapper does that; clip them to [-1, 1] when driving the environment without it).

The trainer exports the policy of each checkpoint it keeps to `<logdir>/policy/<step>/` and
deletes the exports of the checkpoints it deletes (`train.checkpoints_to_keep`).

`metadata` (a string variable) is JSON: the spaces, whether the policy is recurrent, the
environment step it was exported at and the run's operative gin configuration, from which
`restore.environment_from_config` rebuilds the wrapped environment.

    policy = tf.saved_model.load('logs/run/policy/100352')
    action = policy.signatures['deterministic_action'](observ=observ)['action']
"""

import copy
import json
import os
import shutil
import tempfile

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from google.protobuf import message
from tensorflow.core.protobuf import saved_model_pb2

# The fingerprint that tf.saved_model.save writes, for exports that reuse an earlier program.
from tensorflow.python.saved_model import fingerprinting_utils

from agents.runs import recovery, run_config, run_dir
from agents.storage import failures

FORMAT = 'batchppo-policy/1'
SIGNATURES = ('deterministic_action', 'sampled_action')


class PolicyLoadError(Exception):
    """A directory that holds no exported policy, a damaged one, or one of an unknown format."""


def space_to_dict(space):
    """A JSON-ready description of a Box or Discrete space (bounds may be +-inf)."""
    if isinstance(space, gym.spaces.Box):
        return {'type': 'Box', 'shape': list(space.shape), 'dtype': str(space.dtype),
                'low': space.low.tolist(), 'high': space.high.tolist()}
    if isinstance(space, gym.spaces.Discrete):
        return {'type': 'Discrete', 'n': int(space.n), 'start': int(space.start)}
    raise ValueError(f'cannot export a policy for the space {space}: only Box and Discrete')


def space_from_dict(description):
    """The space that `space_to_dict` described."""
    if description['type'] == 'Box':
        dtype = np.dtype(description['dtype'])
        return gym.spaces.Box(np.array(description['low'], dtype),
                              np.array(description['high'], dtype),
                              tuple(description['shape']), dtype)
    if description['type'] == 'Discrete':
        return gym.spaces.Discrete(description['n'], start=description['start'])
    raise ValueError(f'unknown space description {description!r}')


class _ExportedPolicy(tf.Module):
    """What the SavedModel holds: a copy of the acting half of the agent and its signatures.

    The copy (policy network and observation normalizer, with variables of their own) takes
    the agent's values in `PolicyExporter.capture`, so a save can run while the agent goes on
    training.
    """

    def __init__(self, policy, normalizer, observ_shape, metadata, seed, jit_compile):
        super().__init__(name='exported_policy')
        self.policy = policy = copy.deepcopy(policy)
        self.observ_normalizer = normalizer = copy.deepcopy(normalizer)
        self.random = tf.random.Generator.from_seed(seed)
        self.metadata = tf.Variable(json.dumps(metadata), trainable=False, name='metadata')
        # Frames go in as the environment gives them (the policy scales them itself).
        observ_spec = tf.TensorSpec([None, *observ_shape],
                                    tf.uint8 if policy.takes_frames else tf.float32, name='observ')

        def normalize(observ):  # The algorithm's normalization, on the copy.
            return normalizer.normalize(observ) if normalizer is not None else observ

        def act(observ, state, reset, greedy):
            # The networks' leading member axis: an exported policy is one member's.
            state = policy.reset_state(tf.nest.map_structure(lambda x: x[None], state),
                                       reset[None])
            params, new_state = policy.step(normalize(observ[None]), state)
            distribution = policy.distribution(params)
            if greedy:
                action = distribution.mode()
            else:
                action = distribution.sample(
                    seed=tf.cast(self.random.make_seeds(1)[:, 0], tf.int32))
            return action[0], tf.nest.map_structure(lambda x: x[0], new_state)

        if policy.recurrent:
            state_shape = policy.initial_state(1).shape[2:]
            specs = [observ_spec, tf.TensorSpec([None, *state_shape], tf.float32, name='state'),
                     tf.TensorSpec([None], tf.bool, name='reset')]

            def deterministic_action(observ, state, reset):
                action, new_state = act(observ, state, reset, greedy=True)
                return {'action': action, 'state': new_state}

            def sampled_action(observ, state, reset):
                action, new_state = act(observ, state, reset, greedy=False)
                return {'action': action, 'state': new_state}

            def initial_state(batch_size):
                return {'state': policy.initial_state(batch_size)[0]}

            self.initial_state = tf.function(
                initial_state, input_signature=[tf.TensorSpec([], tf.int32, name='batch_size')],
                autograph=False)
        else:
            specs = [observ_spec]
            no_reset = tf.zeros([0], tf.bool)

            def deterministic_action(observ):
                return {'action': act(observ, (), no_reset, greedy=True)[0]}

            def sampled_action(observ):
                return {'action': act(observ, (), no_reset, greedy=False)[0]}

        # No AutoGraph: there is no tensor-dependent Python control flow to convert, and
        # converting lengthened building the exporter (benchmarks/README.md, "Tracing and graph
        # optimization").
        self.deterministic_action = tf.function(
            deterministic_action, input_signature=specs, jit_compile=jit_compile, autograph=False)
        self.sampled_action = tf.function(
            sampled_action, input_signature=specs, jit_compile=jit_compile, autograph=False)

    def signatures(self):
        functions = {name: getattr(self, name) for name in SIGNATURES}
        if self.policy.recurrent:
            functions['initial_state'] = self.initial_state
        return {name: function.get_concrete_function() for name, function in functions.items()}


# Arguments that gin refuses to bind: the trainer and the export tool pass the run's agent and
# spaces, and an explicit argument would silently win over a binding.
NOT_GIN_BINDABLE = ('agent', 'observation_space', 'action_space')


@gin.configurable(denylist=NOT_GIN_BINDABLE)
class PolicyExporter:
    """Exports one agent's policy again and again (e.g. at every evaluation), tracing once.

    Only the first export runs `tf.saved_model.save`: its 100 to 200 ms of Python, which hold
    the GIL the trainer's environment steps need, went into rebuilding the same program each
    time. Later exports write that program's `saved_model.pb` again and the values as the
    variables checkpoint of the same module (a few ms), which is what a save writes.

    Gin binds `seed` and `jit_compile` (e.g. `PolicyExporter.jit_compile = True` in a training
    config); binding one of `NOT_GIN_BINDABLE` is an error when the config is parsed.
    """

    def __init__(self, agent, observation_space, action_space, seed=0, jit_compile=False):
        """Prepares the export of `agent` acting in these (wrapped environment) spaces.

        Args:
          agent: the algorithm (see agents/algorithms/algorithm.py) whose policy to export.
          observation_space, action_space: the spaces of the wrapped environment it acts in.
          seed: seeds the generator of the `sampled_action` signature.
          jit_compile: compile the signatures with XLA. Off by default: `deterministic_action`
            then computes the very same actions as evaluation (the algorithms' greedy `act`
            runs without XLA; with XLA they differ in the last bits), and runtimes without XLA
            serve it.
        """
        policy, normalizer = agent.exported_policy()
        if tuple(observation_space.shape) != tuple(policy.observ_shape):
            raise ValueError(f'observation space {observation_space} does not match the policy\'s '
                             f'observation shape {policy.observ_shape}')
        state = policy.initial_state(1)
        if policy.recurrent and not isinstance(state, tf.Tensor):
            raise ValueError('only recurrent policies whose state is one tensor can be exported')
        self._metadata = {
            'format': FORMAT,
            'observation_space': space_to_dict(observation_space),
            'action_space': space_to_dict(action_space),
            'recurrent': bool(policy.recurrent),
            'state_shape': list(state.shape[2:]) if policy.recurrent else None,
        }
        self._sources = (policy, normalizer)
        self._module = _ExportedPolicy(policy, normalizer, observation_space.shape,
                                       dict(self._metadata), seed, jit_compile)
        self._signatures = self._module.signatures()
        # Keys its checkpoint like the variables of a SavedModel of the module.
        self._variables = tf.train.Checkpoint(root=self._module)
        self._program = None  # saved_model.pb of the first export, read back from it.

    @property
    def program_saved(self):
        """Whether the first export (the one that runs `tf.saved_model.save`) is written."""
        return self._program is not None

    def export(self, directory, step=None, config=None):
        """Writes the agent's policy as it is now to `directory` (see `capture` and `write`).

        Args:
          directory: the SavedModel directory to create, e.g. `<logdir>/policy/<step>`.
          step: the environment step the policy was trained to, recorded in the metadata.
          config: the run's operative gin configuration, recorded in the metadata.
        """
        self.capture(step=step, config=config)
        return self.write(directory)

    def capture(self, step=None, config=None):
        """Copies the agent's policy and normalizer values, and the metadata, for `write`.

        After this the agent may change: `write` saves what was captured, also from another
        thread while the agent trains (the trainer exports in the background).
        """
        copies = (self._module.policy, self._module.observ_normalizer)
        for copy_, source in zip(copies, self._sources, strict=True):
            if source is not None:
                for mine, theirs in zip(copy_.variables, source.variables, strict=True):
                    mine.assign(theirs)
        metadata = dict(self._metadata, step=None if step is None else int(step), config=config)
        self._module.metadata.assign(json.dumps(metadata))

    def write(self, directory):
        """Writes the captured policy to `directory`, replacing what is there; returns it.

        The model is written next to `directory` and renamed into place, so `directory` holds a
        complete policy (the old or the new one) at any time except for the instant between
        two renames when an old one is replaced.
        """
        directory = os.path.abspath(directory)
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise FileExistsError(f'cannot export the policy to {directory}: it is a file')
        if (os.path.isdir(directory) and os.listdir(directory) and
                not os.path.isfile(os.path.join(directory, 'saved_model.pb'))):
            raise FileExistsError(f'cannot export the policy to {directory}: it holds other files '
                                  '(only an empty directory or an earlier export is replaced)')
        parent = os.path.dirname(directory)
        os.makedirs(parent, exist_ok=True)
        temporary = tempfile.mkdtemp(prefix=f'.{os.path.basename(directory)}.partial-',
                                     dir=parent)
        try:
            if self._program is None:
                tf.saved_model.save(self._module, temporary, signatures=self._signatures)
                with open(os.path.join(temporary, tf.saved_model.SAVED_MODEL_FILENAME_PB),
                          'rb') as f:
                    self._program = f.read()
            else:
                self._write_saved_model(temporary)
            run_config.replace_directory(temporary, directory)
        finally:
            if os.path.exists(temporary):
                shutil.rmtree(temporary)
        return directory

    def _write_saved_model(self, directory):
        """Writes into `directory` what tf.saved_model.save would: the first export's program,
        the current values, the (empty) assets and the fingerprint of the whole."""
        os.makedirs(os.path.join(directory, tf.saved_model.VARIABLES_DIRECTORY))
        os.makedirs(os.path.join(directory, tf.saved_model.ASSETS_DIRECTORY))
        self._variables.write(os.path.join(
            directory, tf.saved_model.VARIABLES_DIRECTORY, tf.saved_model.VARIABLES_FILENAME))
        with open(os.path.join(directory, tf.saved_model.SAVED_MODEL_FILENAME_PB), 'wb') as f:
            f.write(self._program)
        fingerprinting_utils.write_fingerprint(directory)


def export_policy(agent, directory, observation_space, action_space, step=None, config=None,
                  **exporter_kwargs):
    """Exports `agent`'s policy as a SavedModel to `directory` (see `PolicyExporter`)."""
    exporter = PolicyExporter(agent, observation_space, action_space, **exporter_kwargs)
    return exporter.export(directory, step=step, config=config)


def prune_exports(policy_dir, keep_steps):
    """Deletes the policies under `policy_dir` whose step is not in `keep_steps`.

    The trainer keeps the policies of the checkpoints it keeps, so both stay bounded alike.
    Only directories named by a step number are touched.
    """
    keep = {int(step) for step in keep_steps}
    for step in run_dir.exported_steps(policy_dir):
        if step not in keep:
            shutil.rmtree(os.path.join(policy_dir, str(step)))


class SavedPolicy:
    """An exported policy, loaded with TensorFlow alone, acting on numpy arrays.

    Follows the policy interface of `agents.tools.evaluation`: deterministic by default,
    sampling with `greedy=False`.

    Attributes:
      observation_space, action_space: the spaces of the wrapped environment it acts in.
      recurrent: whether it carries a state between steps.
      step: the environment step it was exported at (None if unknown).
      config: the operative gin configuration of its training run (None if unknown).
    """

    def __init__(self, directory, greedy=True):
        if not os.path.isdir(directory):
            raise PolicyLoadError(f'policy {directory} does not exist or is not a directory')
        if not os.path.isfile(os.path.join(directory, tf.saved_model.SAVED_MODEL_FILENAME_PB)):
            raise PolicyLoadError(f'{directory} holds no exported policy (no saved_model.pb)')
        problem = saved_model_problem(directory)
        if problem:
            raise PolicyLoadError(f'{directory} holds a damaged SavedModel: {problem}')
        try:
            self._model = tf.saved_model.load(directory)
        except Exception as error:  # The loader raises OSError, OpError, ValueError...
            raise PolicyLoadError(f'{directory} holds a SavedModel that does not load: '
                                  f'{failures.first_line(error)}') from error
        try:
            metadata = json.loads(self._model.metadata.numpy().decode('utf-8'))
        except (AttributeError, ValueError) as error:
            raise PolicyLoadError(f'{directory} holds a SavedModel that is not an exported '
                                  f'policy: {error}') from error
        if metadata.get('format') != FORMAT:
            raise PolicyLoadError(f'{directory} holds a policy of format '
                                  f'{metadata.get("format")!r}, expected {FORMAT!r}')
        self.directory = directory
        self.metadata = metadata
        self.observation_space = space_from_dict(metadata['observation_space'])
        self.action_space = space_from_dict(metadata['action_space'])
        self.recurrent = metadata['recurrent']
        self.step = metadata.get('step')
        self.config = metadata.get('config')
        self._act = self._model.deterministic_action if greedy else self._model.sampled_action
        # float32, or uint8 for a policy that takes frames.
        signature = self._model.signatures['deterministic_action'].structured_input_signature
        self._observ_dtype = signature[1]['observ'].dtype

    def initial_state(self, batch_size):
        if not self.recurrent:
            return ()
        return self._model.initial_state(tf.constant(batch_size, tf.int32))['state'].numpy()

    def __call__(self, observ, state, reset):
        observ = tf.constant(observ, self._observ_dtype)
        if not self.recurrent:
            return self._act(observ)['action'].numpy(), state
        outputs = self._act(observ, tf.constant(state, tf.float32), tf.constant(reset, tf.bool))
        return outputs['action'].numpy(), outputs['state'].numpy()


def saved_model_problem(directory):
    """Why the SavedModel files in `directory` do not read back, or None if they do.

    Checked before loading: for a truncated or missing file TensorFlow's loader raises errors
    of many types (OSError, FileNotFoundError, IndexError...) that do not all say which file.
    The variables are checked as any checkpoint is, every tensor against its checksum.
    """
    program = os.path.join(directory, tf.saved_model.SAVED_MODEL_FILENAME_PB)
    try:
        with open(program, 'rb') as f:
            saved_model_pb2.SavedModel().ParseFromString(f.read())
    except (OSError, message.DecodeError) as error:
        return (f'{tf.saved_model.SAVED_MODEL_FILENAME_PB} does not parse '
                f'({failures.first_line(error)})')
    variables = os.path.join(tf.saved_model.VARIABLES_DIRECTORY,
                             tf.saved_model.VARIABLES_FILENAME)
    problem = recovery.checkpoint_problem(os.path.join(directory, variables))
    if problem:
        return f'{variables} does not read back ({problem})'
    return None
