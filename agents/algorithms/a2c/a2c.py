"""Synchronous advantage actor-critic (A2C): an actor-critic (actor_critic.py) with A2C's update.

This follows Stable-Baselines3's A2C (stable_baselines3/a2c/a2c.py), the synchronous variant of
the A3C paper (Mnih et al. 2016, https://arxiv.org/abs/1602.01783): each update takes exactly one
gradient step on the whole rollout, `T` steps of `N = num_envs` environments, with

    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    policy_loss = -mean(advantage * log pi(action | observ))
    value_loss = mean((return - V(observ))^2)      (SB3's F.mse_loss: no factor 0.5)

where advantages and returns come from GAE(lambda) over the rollout (lambda = 1 by default: plain
n-step returns bootstrapped from the value of the observation after the rollout's last step, or
after a truncated episode's last one). The mean is over all `T x N` steps.

The rollout's extras hold only the value estimates (and, for recurrent policies, the policy
state, of which the update reads the first step's): unlike PPO, A2C is on-policy with a single
gradient step, so the policy that acted is the one the update differentiates, and
recomputing its log-probs inside the gradient tape is all the update needs.
"""

import functools

import gin
import tensorflow as tf

from agents.algorithms import actor_critic, members, networks, optimizers

OPTIMIZERS = ('rmsprop', 'adam')


@gin.configurable
class A2C(actor_critic.ActorCritic):
    """A2C agent: policy and value networks, optimizer, normalizers and update counter.

    The defaults are SB3's A2C defaults: learning rate 7e-4, RMSprop (alpha 0.99, epsilon 1e-5),
    discount 0.99, gae_lambda 1.0, value_coef 0.5, entropy_coef 0.0, gradient-norm clip 0.5, no
    advantage normalization; neither observations nor rewards are normalized (SB3 leaves that
    to a VecNormalize wrapper, which the zoo enables per environment). The rollout length
    (SB3's n_steps = 5) is the loop's, not the algorithm's.
    """

    def __init__(
            self,
            observ_shape,
            action_size,
            num_envs,
            policy_network=networks.FeedForwardGaussianPolicy,
            value_network=networks.FeedForwardValue,
            discount=0.99,
            gae_lambda=1.0,
            learning_rate=7e-4,
            lr_anneal_updates=None,
            optimizer='rmsprop',
            rmsprop_alpha=0.99,
            optimizer_epsilon=1e-5,
            max_grad_norm=0.5,
            value_coef=0.5,
            entropy_coef=0.0,
            normalize_advantages=False,
            normalize_observ=False,
            observ_clip=10.0,
            scale_reward=False,
            reward_clip=10.0,
            jit_compile=True,
            jit_compile_act=False,
            seed=0,
            population=None,
            name=None):
        """Builds the agent.

        Args:
          observ_shape: shape of one observation.
          action_size: action dimensions (continuous) or number of actions (discrete); passed
            to `policy_network`.
          num_envs: environments in a rollout (the reward scaler keeps one discounted return
            per environment).
          policy_network: factory `(observ_shape, action_size, seed) -> policy` (networks.py).
            Recurrent policies train on the whole rollout as one sequence per environment.
          value_network: factory `(observ_shape, seed) -> value network`; None for a policy
            with a value head of its own (shared_torso.py).
          discount: gamma.
          gae_lambda: GAE's lambda; SB3's A2C default 1.0 gives n-step returns.
          learning_rate: the optimizer's initial learning rate.
          lr_anneal_updates: updates over which the learning rate decays linearly to zero (as
            the zoo's `lin_7e-4`); None keeps it constant.
          optimizer: 'rmsprop' (SB3's `use_rms_prop=True`: PyTorch's RMSprop, see
            optimizers.RMSprop)
            or 'adam' (SB3's `use_rms_prop=False`: Adam with betas (0.9, 0.999)).
          rmsprop_alpha: RMSprop's decay of the squared-gradient average (PyTorch's alpha,
            Keras' rho).
          optimizer_epsilon: epsilon of either optimizer (SB3: rms_prop_eps 1e-5; for Adam its
            ActorCriticPolicy also sets 1e-5).
          max_grad_norm: global gradient-norm clip (over policy and value weights together, as
            SB3 clips all the policy's parameters); None disables clipping.
          value_coef, entropy_coef: weights of the value loss and of the entropy bonus.
          normalize_advantages: standardize the rollout's advantages as SB3 does, with the
            unbiased standard deviation: `(A - mean) / (std + 1e-8)`.
          normalize_observ: standardize observations by streaming statistics (VecNormalize's
            norm_obs).
          observ_clip: clip normalized observations to +- this value (VecNormalize's clip_obs
            10); None: no clip.
          scale_reward: divide rewards by the std of the discounted return (VecNormalize's
            norm_reward).
          reward_clip: clip scaled rewards to +- this value (VecNormalize's clip_reward 10);
            None: no clip.
          jit_compile: compile `update` with XLA.
          jit_compile_act: compile the sampling `act` with XLA; off by default, as PPO's (XLA's
            spinning intra-op threads slow environment worker processes).
          seed: seeds network initialization and action sampling.
          population: None for a lone agent; for a population, the lone agents (of these
            settings but for their seeds and MEMBER_HYPERPARAMETERS) that are its members.
          name: module name.
        """
        if optimizer not in OPTIMIZERS:
            raise ValueError(f'Unknown optimizer {optimizer!r}; expected one of {OPTIMIZERS}.')
        actor_critic.check_arguments(
            positive=('optimizer_epsilon',), non_negative=('value_coef',),
            optimizer_epsilon=optimizer_epsilon, value_coef=value_coef)
        if not 0.0 <= rmsprop_alpha < 1.0:
            raise ValueError(f'rmsprop_alpha must lie in [0, 1), got {rmsprop_alpha!r}.')
        if optimizer == 'rmsprop':
            optimizer = functools.partial(optimizers.RMSprop, alpha=rmsprop_alpha,
                                          epsilon=optimizer_epsilon)
        else:
            optimizer = functools.partial(optimizers.Adam, epsilon=optimizer_epsilon)
        super().__init__(
            observ_shape, action_size, num_envs, policy_network, value_network, optimizer,
            dict(learning_rate=learning_rate, entropy_coef=entropy_coef, discount=discount,
                 gae_lambda=gae_lambda),
            lr_anneal_updates, max_grad_norm, normalize_observ, observ_clip, scale_reward,
            reward_clip, jit_compile, jit_compile_act, seed, population, name)
        self._value_coef = value_coef
        self._normalize_advantages = normalize_advantages

    def _update(self, batch):
        """The update as one TF program: reward scaling, GAE, one gradient step, statistics."""
        batch = tf.nest.map_structure(self.member_major, batch)  # [K, T, N, ...]
        extras = batch['extras']
        reward, advantage, return_, done = self._targets(batch)
        data = {
            'observ': self.normalize(batch['observ']),
            'action': tf.cast(batch['action'], self.policy.action_dtype),
            'advantage': advantage,
            'return': return_,
            # The state recorded at the first step is already reset; later steps restart it
            # after every episode end.
            'reset': tf.concat([tf.zeros_like(done[:, :1]), done[:, :-1]], 1),
            'policy_state': tf.nest.map_structure(
                lambda state: state[:, 0], extras.get('policy_state', ())),
        }
        self._anneal_learning_rate()
        with tf.GradientTape() as tape:
            loss, metrics = self.loss(data)
        applied, norm, nonfinite = self._gradient_step(loss, tape)
        with tf.control_dependencies([applied]):
            self._finish_update(batch)
        metrics.update({
            'gradient_norm': norm,
            'learning_rate': tf.identity(self.optimizer.learning_rate),
            'nonfinite': self.nonfinite_report(nonfinite),
            **self._summary(reward, advantage, return_, extras['value']),
        })
        return metrics

    def loss(self, data):
        """The whole A2C objective on each member's rollout `[K, T, N, ...]`: ([K] losses,
        {name: [K]}).

        `data` holds observ (normalized), action, advantage, return, reset (restart the policy
        state before step t) and policy_state (the state at step 0; `()` for feed-forward
        policies). Advantages and returns are targets, not differentiated through.
        """
        params, value = self.params_and_value(data['observ'], data['policy_state'],
                                              data['reset'])
        policy = self.policy.distribution(params)
        advantage = tf.stop_gradient(data['advantage'])
        if self._normalize_advantages:
            # SB3 divides by torch's std, which is the unbiased one.
            count = tf.cast(tf.size(advantage[0]), tf.float32)
            mean, variance = tf.nn.moments(advantage, axes=[1, 2], keepdims=True)
            std = tf.sqrt(variance * count / tf.maximum(count - 1.0, 1.0))
            advantage = (advantage - mean) / (std + 1e-8)
        policy_loss = -members.mean(advantage * policy.log_prob(data['action']))
        value_loss = members.mean(
            tf.square(tf.stop_gradient(data['return']) - value))
        entropy = members.mean(policy.entropy())
        loss = (policy_loss + self._value_coef * value_loss
                - self.hyperparameter('entropy_coef') * entropy)
        metrics = {'loss': loss, 'policy_loss': policy_loss, 'value_loss': value_loss,
                   'entropy': entropy}
        return loss, metrics
