"""Tests for rendering: native states drawn by Gymnasium's envs."""

import gymnasium as gym
import numpy as np
from absl.testing import absltest, parameterized

import agents.envs
from agents.envs import pendulum, rendering

_IDS = ('Pendulum-v1', 'CartPole-v1', 'MountainCarContinuous-v0', 'Acrobot-v1')


class RenderingTest(parameterized.TestCase):

    @parameterized.parameters(*_IDS)
    def test_frames_are_gymnasiums_frames_of_the_state(self, env_id):
        env = agents.envs.make(env_id, 2, seed=0)
        env.reset()
        states = env.state.numpy()
        reference = gym.make(env_id, render_mode='rgb_array')
        reference.reset(seed=0)
        reference.unwrapped.state = env.env.to_gym_state(states[1])
        expected = reference.render()
        reference.close()
        with rendering.GymRenderer(env.env) as renderer:
            frames = [renderer.render(state) for state in states]
            self.assertEqual(frames[0].dtype, np.uint8)
            self.assertEqual(frames[0].shape, expected.shape)
            self.assertEqual(frames[0].ndim, 3)
            np.testing.assert_array_equal(frames[1], expected)
            # Another state, another picture.
            self.assertFalse(np.array_equal(frames[0], frames[1]))
            np.testing.assert_array_equal(renderer.render(states[1]), frames[1])
            with self.assertRaisesRegex(ValueError, 'state must have shape'):
                renderer.render(states)

    def test_render_batch_env_draws_the_last_torque(self):
        env = agents.envs.make('Pendulum-v1', 2, seed=0, wrappers=['range_normalize'])
        env.reset()
        with rendering.GymRenderer(env.env) as renderer:
            fresh = rendering.render_batch_env(env, 1, renderer)
            np.testing.assert_array_equal(fresh, renderer.render(env.state.numpy()[1]))
            env.step(np.array([[0.0], [1.0]], np.float32))
            stepped = rendering.render_batch_env(env, 1, renderer)
            # The agent's 1.0 is the full torque 2.0 after range_normalize.
            np.testing.assert_array_equal(
                stepped, renderer.render(env.state.numpy()[1], np.array([2.0], np.float32)))
            self.assertFalse(np.array_equal(stepped, renderer.render(env.state.numpy()[1])))
        # Without a renderer one is made for the frame.
        np.testing.assert_array_equal(rendering.render_batch_env(env, 1), stepped)
        with self.assertRaisesRegex(IndexError, 'out of range'):
            rendering.render_batch_env(env, 2)

    def test_pendulum_arrow_attributes(self):
        native = pendulum.Pendulum()
        self.assertEqual(native.gym_render_attributes(None), {'last_u': None})
        self.assertEqual(native.gym_render_attributes(np.array([5.0]))['last_u'], 2.0)


if __name__ == '__main__':
    absltest.main()
