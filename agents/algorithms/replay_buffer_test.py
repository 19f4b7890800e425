"""Tests of the replay buffer: a ring of the newest transitions, sampled uniformly."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import replay_buffer


def _batch(start, steps, envs):
    """A time-major batch whose transition t, n carries the number start + t * envs + n."""
    numbers = np.arange(start, start + steps * envs, dtype=np.float32).reshape(steps, envs)
    return {'observ': numbers[..., None] * [1.0, -1.0], 'action': numbers[..., None],
            'reward': numbers, 'next_observ': numbers[..., None] * [2.0, 0.0],
            'terminated': numbers % 2 == 0}


class ReplayBufferTest(absltest.TestCase):

    def test_keeps_the_newest_capacity_transitions_step_by_step(self):
        buffer = replay_buffer.ReplayBuffer(5, (2,), (1,))
        buffer.add(_batch(0, 2, 2))  # 0 1 2 3
        self.assertEqual(int(buffer.size), 4)
        buffer.add(_batch(4, 2, 2))  # 4 5 6 7: 4 at slot 4, then 5 6 7 over 0 1 2.
        self.assertEqual(int(buffer.size), 5)
        self.assertEqual(int(buffer.added), 8)
        np.testing.assert_array_equal(buffer.storage['reward'].numpy(), [5, 6, 7, 3, 4])
        np.testing.assert_array_equal(buffer.storage['observ'].numpy()[:, 1], [-5, -6, -7, -3, -4])
        np.testing.assert_array_equal(buffer.storage['terminated'].numpy(),
                                      [False, True, False, False, True])

    def test_a_batch_larger_than_the_buffer_keeps_its_last_transitions(self):
        buffer = replay_buffer.ReplayBuffer(3, (2,), (1,))
        buffer.add(_batch(0, 4, 2))  # 0..7: the last three, 5 6 7, at slots 5, 6, 7 mod 3.
        np.testing.assert_array_equal(np.sort(buffer.storage['reward'].numpy()), [5, 6, 7])
        self.assertEqual(int(buffer.added), 8)

    def test_samples_only_what_it_holds_reproducibly_in_a_compiled_call(self):
        buffer = replay_buffer.ReplayBuffer(100, (2,), (1,))

        @tf.function(jit_compile=True, autograph=False)
        def add_and_sample(batch, seed):
            with tf.control_dependencies([buffer.add(batch)]):
                return buffer.sample(256, seed)

        sample = add_and_sample(_batch(0, 3, 2), tf.constant([1, 2]))
        self.assertEqual(sample['observ'].shape, (256, 2))
        self.assertEqual(set(sample['reward'].numpy()), set(range(6)))
        np.testing.assert_array_equal(sample['observ'].numpy()[:, 0], sample['reward'].numpy())
        again = buffer.sample(256, tf.constant([1, 2]))
        np.testing.assert_array_equal(again['reward'].numpy(), sample['reward'].numpy())

    def test_a_batch_not_kept_changes_nothing_even_across_the_wrap_in_xla(self):
        buffer = replay_buffer.ReplayBuffer(5, (2,), (1,))
        add = tf.function(buffer.add, jit_compile=True, autograph=False)
        add(_batch(0, 2, 2), tf.constant(True))  # 0 1 2 3
        before = {field: values.numpy() for field, values in buffer.storage.items()}
        add(_batch(10, 2, 2), tf.constant(False))  # Would wrap over slots 4, 0, 1, 2.
        self.assertEqual(int(buffer.added), 4)
        for field, values in buffer.storage.items():
            np.testing.assert_array_equal(values.numpy(), before[field], err_msg=field)
        add(_batch(4, 2, 2), tf.constant(True))
        np.testing.assert_array_equal(buffer.storage['reward'].numpy(), [5, 6, 7, 3, 4])
        self.assertEqual(int(buffer.added), 8)

    def test_refuses_a_bad_capacity(self):
        for capacity in (0, -1, 2.5, True):
            with self.assertRaisesRegex(ValueError, 'capacity must be a positive integer'):
                replay_buffer.ReplayBuffer(capacity, (2,), (1,))

    def test_refuses_a_ring_that_cannot_fit_before_allocating_it(self):
        # observ and next_observ 3 x 4 bytes each, action 2 x 4, reward 4, terminated 1: 37.
        replay_buffer.ReplayBuffer(1000, (3,), (2,), available_bytes=37_000)
        with self.assertRaises(ValueError) as raised:
            replay_buffer.ReplayBuffer(10**12, (3,), (2,), available_bytes=8 * 2**30)
        self.assertEqual(str(raised.exception),
                         'a replay buffer of 1000000000000 transitions (37 bytes each) needs '
                         "34458.9 GiB, more than this machine's 8.0 GiB; use a smaller "
                         'buffer_size')
        with self.assertRaisesRegex(ValueError, r'more than this machine\'s \d+\.\d GiB'):
            replay_buffer.ReplayBuffer(10**12, (3,), (2,))  # This machine's memory.


if __name__ == '__main__':
    absltest.main()
