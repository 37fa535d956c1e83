"""Keras's Adam on dense gradients as one TensorFlow kernel per variable.

Keras 3's `Adam.update_step` is seven element-wise ops per variable, each a pass over the
variable's memory; TensorFlow's `ResourceApplyAdam` kernel computes the same formula, in
the same order, in one pass (the results agree to rounding: within 1e-6 relative after
several float32 steps, `tests/ps/test_fused_adam.py`; Keras's own float64 update rounds
some of its factors to float32, the kernel does not):

    alpha = lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
    m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2)
    variable -= m * alpha / (sqrt(v) + epsilon)

with t the step (`iterations + 1`) and lr the optimizer's learning rate at `iterations`
(a schedule's too). For the 0.5M parameters of the bench MLP (784-512-256-10) the step
takes 0.9 ms against Keras's 2.2-2.7 ms, in a `tf.function` in one process.

The shard uses it only where Keras's `apply` would do nothing else: a plain
`keras.optimizers.Adam` without amsgrad, weight decay, clipping, loss scaling, gradient
accumulation or moving averages, on variables with no constraint, for a push of dense
gradients alone; everything else goes through `apply`. The slots are the optimizer's own
variables, so checkpoints and `state()` are unchanged.
"""

import keras
import tensorflow as tf

_UNFUSED_OPTIONS = ("amsgrad", "weight_decay", "clipnorm", "clipvalue", "global_clipnorm",
                    "use_ema", "loss_scale_factor", "gradient_accumulation_steps")


def fusable(optimizer, variables):
    """Whether `optimizer`'s update of `variables` (tf.Variables) is exactly `apply_step`'s."""
    return (type(optimizer) is keras.optimizers.Adam
            and not any(getattr(optimizer, option, None) for option in _UNFUSED_OPTIONS)
            and all(getattr(v, "constraint", None) is None for v in variables))


def apply_step(optimizer, gradients, variables, slots):
    """One Adam step of dense `gradients` (each of its variable's dtype) on `variables`, as
    `optimizer.apply(gradients, variables)` would make it; call it in a `tf.function`.

    Args:
        optimizer: a `fusable` Adam, built on `variables`.
        gradients: dense tensors, one per variable.
        variables: the tf.Variables, in the order of `gradients`.
        slots: per variable, its `(momentum, velocity)` optimizer variables.
    """
    rate = optimizer.learning_rate  # at the current step: a schedule is evaluated here
    for gradient, variable, (momentum, velocity) in zip(gradients, variables, slots):
        dtype = variable.dtype
        step = tf.cast(optimizer.iterations + 1, dtype)
        beta_1 = tf.cast(optimizer.beta_1, dtype)
        beta_2 = tf.cast(optimizer.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=momentum.handle, v=velocity.handle,
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(rate, dtype), beta1=beta_1, beta2=beta_2,
            epsilon=tf.cast(optimizer.epsilon, dtype), grad=gradient)
    optimizer.iterations.assign_add(1)
