"""Optimizers that step each of K members (members.py) on its own.

Keras' optimizers step every variable alike; a population needs more: each member its own
learning rate, its own step count (Adam's bias correction) and steps that skip the members whose
update stopped (a non-finite loss or gradient, an early-stopping KL) while the others go on.
Each optimizer here is a `tf.Module` built over a list of `[K, ...]` variables, with
`learning_rate` and `iterations` `[K]`, and computes Keras' (Adam) or PyTorch's (RMSprop)
step for each member. Its slots are in its variables, so a checkpoint of the agent holds them.
"""

import tensorflow as tf

from agents.algorithms import members


class _Optimizer(tf.Module):
    """The slots of each variable, per member learning rates and step counts."""

    SLOTS = ()

    def __init__(self, variables, learning_rate, name=None):
        super().__init__(name=name)
        rates = tf.nest.flatten(learning_rate)
        num_members = variables[0].shape[0]
        self.learning_rate = tf.Variable(
            tf.broadcast_to(tf.constant(rates, tf.float32), [num_members]), trainable=False,
            name='learning_rate')
        self.iterations = tf.Variable(tf.zeros([num_members], tf.int64), trainable=False,
                                      name='iterations')
        with self.name_scope:
            self.slots = {slot: [tf.Variable(tf.zeros_like(variable), trainable=False,
                                             name=f'{slot}_{index}')
                                 for index, variable in enumerate(variables)]
                          for slot in self.SLOTS}

    def apply(self, gradients, variables, mask=None):
        """Steps `variables` ([K, ...] each, the list the optimizer was built over) by
        `gradients` for the members where `mask` ([K] bool; None: all) is true.

        A masked member takes a step of zero: its gradient is zeroed (it may be non-finite) and
        its rates multiplied by zero, which leaves its weights and slots exactly as they were
        and is exact for the others (times one). Unlike a select or a conditional around the
        step, this adds no pass over the weights and slots to XLA's fused update
        (benchmarks/README.md, "The member axis").
        """
        if mask is None:
            mask = tf.ones_like(self.iterations, tf.bool)
        else:
            gradients = [tf.where(members.broadcast(mask, gradient), gradient, 0.0)
                         for gradient in gradients]
        for targets, values in self._updates(gradients, variables, tf.cast(mask, tf.float32)):
            for target, value in zip(targets, values, strict=True):
                target.assign(value)
        self.iterations.assign_add(tf.cast(mask, tf.int64))

    def _updates(self, gradients, variables, step):
        """[(variables or slots, their new values)], each member's rates times its `step`
        ([K] float32, one or zero)."""
        raise NotImplementedError


class Adam(_Optimizer):
    """Keras' Adam (`keras.optimizers.Adam.update_step`), per member."""

    SLOTS = ('momentum', 'velocity')

    def __init__(self, variables, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 name='adam'):
        super().__init__(variables, learning_rate, name=name)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def _updates(self, gradients, variables, step):
        count = tf.cast(self.iterations + 1, tf.float32)
        alpha = step * (self.learning_rate * tf.sqrt(1.0 - tf.pow(self.beta_2, count))
                        / (1.0 - tf.pow(self.beta_1, count)))
        momentum_rate = step * (1.0 - self.beta_1)
        velocity_rate = step * (1.0 - self.beta_2)
        momentums, velocities, weights = [], [], []
        for gradient, variable, momentum, velocity in zip(
                gradients, variables, self.slots['momentum'], self.slots['velocity'],
                strict=True):
            new_momentum = momentum + (gradient - momentum) * members.broadcast(
                momentum_rate, gradient)
            new_velocity = velocity + (tf.square(gradient) - velocity) * members.broadcast(
                velocity_rate, gradient)
            momentums.append(new_momentum)
            velocities.append(new_velocity)
            weights.append(variable - (new_momentum * members.broadcast(alpha, gradient)) / (
                tf.sqrt(new_velocity) + self.epsilon))
        return [(self.slots['momentum'], momentums), (self.slots['velocity'], velocities),
                (variables, weights)]


class RMSprop(_Optimizer):
    """RMSprop as PyTorch computes it, hence as SB3's A2C steps (`use_rms_prop=True`), per
    member.

    `v = alpha * v + (1 - alpha) * g^2` (from zero), then `w -= lr * g / (sqrt(v) + epsilon)`.
    Keras' RMSprop adds epsilon inside the root, `sqrt(v + epsilon)`: with SB3's epsilon 1e-5 that
    floors the denominator at 3e-3 instead of 1e-5, so gradient entries below about 0.03 would
    take far smaller steps than in SB3. (SB3's optional RMSpropTFLike, the TF1 variant, also
    starts `v` at one; that is not this.)
    """

    SLOTS = ('square_average',)

    def __init__(self, variables, learning_rate, alpha=0.99, epsilon=1e-5, name='rmsprop'):
        super().__init__(variables, learning_rate, name=name)
        self.alpha = alpha
        self.epsilon = epsilon

    def _updates(self, gradients, variables, step):
        # A masked member keeps its average: times one plus a zeroed gradient's square.
        decay = tf.where(step > 0, self.alpha, 1.0)
        rate = step * (1.0 - self.alpha)
        learning_rate = step * self.learning_rate
        averages, weights = [], []
        for gradient, variable, average in zip(gradients, variables,
                                               self.slots['square_average'], strict=True):
            new_average = (members.broadcast(decay, average) * average +
                           members.broadcast(rate, gradient) * tf.square(gradient))
            averages.append(new_average)
            weights.append(variable - members.broadcast(learning_rate, gradient) *
                           gradient / (tf.sqrt(new_average) + self.epsilon))
        return [(self.slots['square_average'], averages), (variables, weights)]
