"""A policy and a value head on one torso, as CleanRL's Atari PPO and SB3's `CnnPolicy` have it.

On frames the torso is nearly all of the computation, so the actor-critic runs it once for both
heads: acting, the update's loss and the bootstrap values each take one pass. The value loss then
trains the torso too, weighted against the policy's by the algorithm's `value_coef`.

The policy declares `has_value_head` (networks.py): its actor-critic is built without a value
network and asks the policy for values. It is feed-forward; frames of the last few steps, as
Atari's stacked frames, stand in for a recurrent state.
"""

import gin
import tensorflow as tf

from agents.algorithms import conv_torsos, distributions, networks

# Orthogonal gains of the heads, as CleanRL's `layer_init` on the actor's and the critic's.
POLICY_HEAD_GAIN = 0.01
VALUE_HEAD_GAIN = 1.0


@gin.configurable
class SharedTorsoCategoricalPolicy(networks.FeedForwardPolicy):
    """Categorical policy over `action_size` discrete actions and a state value, both linear
    heads on the features of one torso (default: the Nature CNN on uint8 frames)."""

    action_dtype = tf.int32
    action_shape = ()
    has_value_head = True
    takes_frames = True

    def __init__(self, observ_shape, action_size, torso=conv_torsos.NatureCNN,
                 output_gain=POLICY_HEAD_GAIN, value_gain=VALUE_HEAD_GAIN, seed=0, name=None):
        """`torso`: factory `(frame_shape, seed) -> torso` of conv_torsos.py (e.g.
        `@NatureCNN`, `@ImpalaCNN`), given the observation shape as the frames'."""
        super().__init__(observ_shape, seed, name=name)
        networks.check_sizes(action_size=action_size)
        self.torso = torso(frame_shape=self.observ_shape, seed=self.seeds)
        self.logits = networks.Linear(self.torso.output_size, action_size, output_gain,
                                      [seed + 100 for seed in self.seeds])
        self.value_head = networks.Linear(self.torso.output_size, 1, value_gain,
                                          [seed + 200 for seed in self.seeds])

    def _features(self, observ):
        """The torso's features of `observ` [K, *batch, *observ_shape] and the batch shape."""
        flat, batch_shape = self._flatten_observ(observ, flatten_features=False)
        return self.torso(flat), batch_shape

    def _params(self, observ):
        features, batch_shape = self._features(observ)
        return {'logits': self._unflatten(self.logits(features), batch_shape)}

    def value(self, observ):
        """The state value `[K, *batch]`."""
        features, batch_shape = self._features(observ)
        return self._unflatten(self.value_head(features), batch_shape, scalar=True)

    def params_and_value(self, observ):
        """`(params, value)` of one pass through the torso."""
        features, batch_shape = self._features(observ)
        return ({'logits': self._unflatten(self.logits(features), batch_shape)},
                self._unflatten(self.value_head(features), batch_shape, scalar=True))

    def distribution(self, params):
        return distributions.Categorical(params['logits'], dtype=self.action_dtype)
