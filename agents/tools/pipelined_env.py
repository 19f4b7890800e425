"""Environments in groups that step while the algorithm acts: EnvPool's async mode, made regular.

EnvPool's async mode (`batch_size` < `num_envs`) returns whichever environments finished first,
so that its threads step some environments while the algorithm computes the actions of others.
Its batches then mix environments in an order that changes from run to run, and an algorithm
that wants whole per-environment trajectories must reassemble them. `PipelinedVectorEnv` gets
the same overlap in a fixed order: the N environments are G groups of B = N / G (each a
VectorEnv, e.g. an EnvPool pool of B in sync mode), and a group's step is started
(`step_group_async`) and collected (`step_group_wait`) apart, on a thread of its own, so that
a simulator can act for group g + 1 while group g steps (simulate.py's pipelined rollout). Each
group steps in turn, so every environment's transitions come in order, one per round, and a
rollout is a plain [T, N] batch; the environment ids of group g are g * B, ..., g * B + B - 1.

Seen as one VectorEnv of N environments (what the in-graph batch env, the trainer's restarts
and its signal handling need), `step` steps every group at once and `reset` resets them with
environment i seeded `seed` + i, as one batch would be.
"""

import concurrent.futures

import gymnasium as gym
import numpy as np

AutoresetMode = gym.vector.AutoresetMode


class PipelinedVectorEnv(gym.vector.VectorEnv):
    """G VectorEnvs of B environments each (autoreset disabled), stepped group by group."""

    def __init__(self, groups):
        """`groups`: VectorEnvs of equal size and spaces, with `metadata['autoreset_mode']`
        AutoresetMode.DISABLED; this env closes them."""
        super().__init__()
        self.groups = list(groups)
        if len(self.groups) < 2:
            raise ValueError(f'a pipeline needs at least 2 groups, got {len(self.groups)}')
        first = self.groups[0]
        for group in self.groups:
            if (group.num_envs != first.num_envs
                    or group.single_observation_space != first.single_observation_space
                    or group.single_action_space != first.single_action_space):
                raise ValueError('the groups of a pipeline must have equal sizes and spaces')
            if group.metadata.get('autoreset_mode') != AutoresetMode.DISABLED:
                raise ValueError('the groups of a pipeline must have autoreset disabled')
        self.group_size = int(first.num_envs)
        self.num_envs = self.group_size * len(self.groups)
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {'autoreset_mode': AutoresetMode.DISABLED, 'render_modes': []}
        self.render_mode = None
        # One thread per group: its step runs there while the caller acts for other groups.
        self._threads = [concurrent.futures.ThreadPoolExecutor(1, f'group-{index}')
                         for index in range(len(self.groups))]
        self._pending = [None] * len(self.groups)
        # The exception of a failed step or reset, which TF's error only quotes (the trainer
        # reads it, as environments.py's recorder of a single batch keeps it).
        self.failure = None

    @property
    def num_groups(self):
        return len(self.groups)

    def group_slice(self, group):
        """The environments of `group` in the batch of N."""
        return slice(group * self.group_size, (group + 1) * self.group_size)

    def reset(self, *, seed=None, options=None):
        """Resets all environments, or those in `options['reset_mask']` ([N] bool), group by
        group; `seed`: None or an int (environment i gets `seed` + i). Returns (observations,
        {}): infos are not batched across groups."""
        try:
            return self._reset(seed, options)
        except Exception as error:
            self.failure = error
            raise

    def _reset(self, seed, options):
        mask = None if options is None else options.get('reset_mask')
        parts = []
        for index, group in enumerate(self.groups):
            rows = self.group_slice(index)
            group_seed = None if seed is None else seed + rows.start
            if (mask is None or np.asarray(mask)[rows].any()) and self._pending[index]:
                # Other groups may step meanwhile: the simulator resets one while the next one
                # steps.
                raise gym.error.AlreadyPendingCallError(
                    f'reset of group {index} while it is stepping', 'step')
            if mask is None:
                observ, _ = group.reset(seed=group_seed)
            elif np.asarray(mask)[rows].any():
                observ, _ = group.reset(seed=group_seed,
                                        options={'reset_mask': np.asarray(mask)[rows]})
            else:
                observ = np.zeros((self.group_size, *self.single_observation_space.shape),
                                  self.single_observation_space.dtype)
            parts.append(np.asarray(observ))
        return np.concatenate(parts), {}

    def step(self, actions):
        """Steps every group, side by side; returns the batch of N as one VectorEnv would."""
        for index in range(self.num_groups):
            self.step_group_async(index, np.asarray(actions)[self.group_slice(index)])
        outcomes = [self.step_group_wait(index) for index in range(self.num_groups)]
        return tuple(np.concatenate(parts) for parts in zip(*outcomes, strict=True)) + ({},)

    def step_group_async(self, group, actions):
        """Starts the step of `group` with its B actions; `step_group_wait` collects it."""
        if self._pending[group] is not None:
            raise gym.error.AlreadyPendingCallError(
                f'group {group} is already stepping', 'step')
        self._pending[group] = self._threads[group].submit(self.groups[group].step, actions)

    def step_group_wait(self, group):
        """(observations, rewards, terminations, truncations) of the step `group` started;
        the group's own exception if the step failed."""
        pending, self._pending[group] = self._pending[group], None
        if pending is None:
            raise gym.error.NoAsyncCallError(f'group {group} has no step to wait for', 'step')
        try:
            observations, rewards, terminations, truncations, _ = pending.result()
        except Exception as error:
            self.failure = error
            raise
        return observations, rewards, terminations, truncations

    def cancel_wait(self, reason):
        """Ends the groups' waits for workers (see BatchEnv.cancel_wait)."""
        for group in self.groups:
            group.unwrapped.cancel_wait(reason)

    def waiting(self):
        """The first group's wait for workers going on, or None."""
        return next((wait for wait in (group.unwrapped.waiting() for group in self.groups)
                     if wait is not None), None)

    def close_extras(self, terminate=False):
        for pending in self._pending:
            if pending is not None:
                pending.cancel()
        for thread in self._threads:
            thread.shutdown(wait=not terminate, cancel_futures=True)
        for group in self.groups:
            group.close(terminate=terminate)

    def __repr__(self):
        return f'PipelinedVectorEnv({self.num_groups} groups of {self.group_size})'
