"""The shard's Keras optimizer: rebuilt from the worker's config, applied as compiled graphs.

Applying a Keras optimizer eagerly runs a Python loop of small ops per variable; wrapping
`optimizer.apply` in a `tf.function` removes that overhead (for the gradients of a small CNN,
about 1M parameters in 8 variables, Adam goes from about 63 ms to about 6 ms a push and SGD
from about 7 ms to about 3 ms). A push's *signature* is the set of variables it updates and
whether each gradient is dense or sparse; each signature is traced once with an explicit input
signature (sparse rows have an unknown row count), so the number of rows of an `IndexedSlices`
never causes a retrace. Past `MAX_COMPILED_SIGNATURES` distinct signatures, pushes are applied
eagerly, so a stream of unusual pushes cannot grow the graph cache without bound. A plain
Adam's update of dense gradients is traced as TensorFlow's one-pass kernel (`fused_adam`).

Tracing a signature costs far more than applying it (0.38 s for the first push of the DeepFM
bench's 2 MB DNN, against 2-4 ms for each push after), so `start_warm_up` traces the usual
first one, a dense gradient of every variable, on a thread of its own as soon as a shard has
its model: the workers' first pushes come after their own first step, which takes longer.

Example:

    >>> import keras, tensorflow as tf
    >>> variable = tf.Variable([1.0, 2.0])
    >>> applier = OptimizerApplier(optimizer_from_config(
    ...     '{"class_name": "SGD", "config": {"learning_rate": 0.5}}'), {"w": variable})
    >>> applier.apply({"w": tf.constant([1.0, 1.0])})
    >>> variable.numpy().tolist()
    [0.5, 1.5]
"""

import json
import logging
import threading

import keras
import tensorflow as tf

from elastic_keras.common.errors import PayloadError
from elastic_keras.common.optimizer_contract import builtin_optimizers
from elastic_keras.ps import fused_adam

logger = logging.getLogger(__name__)

MAX_COMPILED_SIGNATURES = 32

_CONFIG_EXCERPT_CHARS = 200


def optimizer_from_config(config):
    """Rebuilds a Keras optimizer from the JSON of `keras.optimizers.serialize(optimizer)`.

    Args:
        config: the JSON text, as carried by `InitModelRequest.optimizer_config`.

    Returns:
        A new, unbuilt `keras.optimizers.Optimizer`.

    Raises:
        PayloadError: the text is not JSON, not an object, or does not describe a Keras
            optimizer (unknown class, bad argument, ...).
    """
    excerpt = config[:_CONFIG_EXCERPT_CHARS]
    if len(config) > _CONFIG_EXCERPT_CHARS:
        excerpt += "..."
    rule = "optimizer_config must be the JSON of keras.optimizers.serialize(optimizer)"
    try:
        spec = json.loads(config)
    except ValueError as exc:
        raise PayloadError(f"{rule}; it is not valid JSON ({exc}). Received: {excerpt!r}") from exc
    if not isinstance(spec, dict):
        raise PayloadError(f"{rule}; it must be a JSON object. Received: {excerpt!r}")
    try:
        # Built-in classes by name: Keras's own registry misses some (Lamb).
        optimizer = keras.optimizers.deserialize(spec, custom_objects=builtin_optimizers())
    except Exception as exc:  # Keras raises ValueError, TypeError, ImportError, ...
        raise PayloadError(
            f"{rule}; Keras cannot rebuild it ({type(exc).__name__}: {exc}). "
            f"Received: {excerpt!r}"
        ) from exc
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise PayloadError(
            f"{rule}; class_name {spec.get('class_name')!r} is not a Keras optimizer "
            f"(rebuilding it gave a {type(optimizer).__name__}). Received: {excerpt!r}"
        )
    return optimizer


def _build_recording_slots(optimizer, variables):
    """Builds `optimizer` on `variables` (`{name: tf.Variable}`) and returns its slots.

    Keras names a slot after its variable's name with "/" and ":" replaced, which can be
    ambiguous; instead this records each `add_variable_from_reference` call while the
    optimizer builds.

    Returns:
        `{(variable name, slot name): optimizer variable}`.
    """
    names = {id(variable): name for name, variable in variables.items()}
    slots = {}
    create = optimizer.add_variable_from_reference

    def recording(reference_variable, name=None, initializer="zeros"):
        slot = create(reference_variable, name=name, initializer=initializer)
        slots[(names[id(reference_variable)], name or "var")] = slot
        return slot

    optimizer.add_variable_from_reference = recording
    try:
        optimizer.build(list(variables.values()))
    finally:
        del optimizer.add_variable_from_reference
    return slots


class _ScaledLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """The optimizer's own learning rate (a value or a schedule) times a settable factor."""

    def __init__(self, base, scale):
        self._base = base
        self._scale = scale

    def __call__(self, step):
        base = self._base
        if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
            base = base(step)
        return tf.cast(base, tf.float32) * self._scale


class OptimizerApplier:
    """Applies gradients to a fixed set of variables with one Keras optimizer.

    The optimizer is built at once on every variable given, so it holds a slot set for each
    and any subset can be updated later; `state()` and `set_state()` copy the slots (keyed by
    variable and slot name) and step count out and back, for checkpoints. Not thread-safe:
    callers serialise `apply` (a warm-up may run beside it).

    Args:
        optimizer: an unbuilt Keras optimizer.
        variables: `{name: tf.Variable}`, the trainable variables gradients may update (a
            variable's `constraint` is applied after each update, as Keras does).
        excluded_from_weight_decay: names of variables the module's optimizer does not
            decay (its `exclude_from_weight_decay`).
    """

    def __init__(self, optimizer, variables, excluded_from_weight_decay=()):
        self.optimizer = optimizer
        self._variables = dict(variables)
        for name, variable in self._variables.items():
            variable.path = name  # what Keras optimizers match names against (Muon)
        if excluded_from_weight_decay:
            optimizer.exclude_from_weight_decay(
                var_list=[self._variables[name] for name in excluded_from_weight_decay])
        # Staleness modulation scales one update's learning rate through this factor.
        self._lr_scale = tf.Variable(1.0, trainable=False, name="lr_scale")
        self._base_rate = optimizer._learning_rate  # a variable, or a schedule
        optimizer.learning_rate = _ScaledLearningRate(optimizer._learning_rate, self._lr_scale)
        self._slots = _build_recording_slots(optimizer, self._variables)
        slot_ids = {id(v) for v in self._slots.values()} | {id(optimizer.iterations)}
        # Other state of the optimizer's own (e.g. Nadam's momentum product), by position.
        self._other_variables = {
            f"{i}:{v.name}": v
            for i, v in enumerate(v for v in optimizer.variables if id(v) not in slot_ids)
        }
        self._compiled = {}
        self._compiling = threading.Lock()
        self._warm_up = None  # the thread of `start_warm_up`
        self._warned_cache_full = False

    def set_learning_rate(self, rate):
        """Assigns the optimizer's learning-rate variable (a float rate's; see
        `ps.learning_rate`): compiled updates read it."""
        self._base_rate.assign(rate)

    @property
    def traces(self):
        """How many graphs pushes have been traced into: one per push signature (which
        variables, dense or rows), whatever the number of rows; a warm-up's counted once it
        has ended (this waits for it)."""
        if self._warm_up is not None:
            self._warm_up.join()
        return len(self._compiled)

    def start_warm_up(self):
        """Traces the update of a push of every variable's dense gradient on a daemon thread,
        ahead of that push, which waits for the trace rather than tracing again. A failure is
        left for that push to meet."""
        signature = tuple((name, False) for name in sorted(self._variables))
        if signature and self._warm_up is None:
            self._warm_up = threading.Thread(target=self._trace, args=(signature,),
                                             name="optimizer-warm-up", daemon=True)
            self._warm_up.start()

    def _trace(self, signature):
        try:
            self._compiled_for(signature)
        except Exception as exc:  # TF raises many kinds; the push that needs it raises too
            logger.debug("Warming up the optimizer's update failed: %s", exc)

    def state(self):
        """The optimizer's state as numpy data, keyed so that it survives re-sharding.

        Returns:
            `(iterations, slots, others)`: the step count; `{variable name: {slot name:
            array}}` for every slot the optimizer made from a variable (`"momentum"`,
            `"velocity"`, ...); `{key: array}` of its other variables, which every shard with
            the same optimizer config has in the same order.
        """
        slots = {}
        for (name, slot), variable in self._slots.items():
            slots.setdefault(name, {})[slot] = variable.numpy()
        others = {key: v.numpy() for key, v in self._other_variables.items()}
        return int(self.optimizer.iterations.numpy()), slots, others

    def set_state(self, iterations, slots, others):
        """Assigns a `state()`: needs a slot for each of this applier's and nothing more.

        Raises:
            ValueError: a slot or other variable is missing, unknown, or has the wrong shape.
        """
        given = {(name, slot): value for name, named in slots.items()
                 for slot, value in named.items()}
        for what, expected, received in (("slots", self._slots, given),
                                         ("other variables", self._other_variables, others)):
            if set(expected) != set(received):
                raise ValueError(
                    f"The optimizer state must hold exactly the {what} of "
                    f"{type(self.optimizer).__name__} on these variables: "
                    f"{sorted(map(str, expected))}. Received: {sorted(map(str, received))}"
                )
            for key, variable in expected.items():
                if tuple(received[key].shape) != tuple(variable.shape):
                    raise ValueError(
                        f"Optimizer {what[:-1]} {key} must have shape "
                        f"{list(variable.shape)}. Received: {list(received[key].shape)}"
                    )
        for key, variable in self._slots.items():
            variable.assign(given[key])
        for key, variable in self._other_variables.items():
            variable.assign(others[key])
        self.optimizer.iterations.assign(iterations)

    def averaged(self):
        """`{name: value}` of the optimizer's moving averages of the variables (`use_ema`),
        what Keras's `fit` leaves in the model at its end; empty without `use_ema`."""
        if not self.optimizer.use_ema:
            return {}
        averages = self.optimizer._model_variables_moving_average
        return {name: averages[self.optimizer._get_variable_index(variable)].numpy()
                for name, variable in self._variables.items()}

    def apply(self, gradients, lr_scale=1.0):
        """Applies one step: `gradients` maps names to dense tensors or `tf.IndexedSlices`.

        Every gradient must already have its variable's dtype and shape (rows and row ids in
        range for `tf.IndexedSlices`); the caller has checked them. One call advances the
        optimizer's iteration count by one; an empty `gradients` does nothing. `lr_scale`
        multiplies the learning rate of this step only.
        """
        if not gradients:
            return
        if self._lr_scale.numpy() != lr_scale:
            self._lr_scale.assign(lr_scale)
        names = sorted(gradients)
        signature = tuple((name, isinstance(gradients[name], tf.IndexedSlices)) for name in names)
        function = self._compiled_for(signature)
        if function is None:
            self.optimizer.apply(
                [gradients[name] for name in names], [self._variables[name] for name in names]
            )
            return
        flat = []
        for name, sparse in signature:
            gradient = gradients[name]
            flat += [gradient.values, gradient.indices] if sparse else [gradient]
        function(*flat)

    def _compiled_for(self, signature):
        function = self._compiled.get(signature)
        if function is not None:
            return function
        with self._compiling:
            function = self._compiled.get(signature)
            if function is not None or len(self._compiled) < MAX_COMPILED_SIGNATURES:
                if function is None:
                    function = self._compiled[signature] = self._compile(signature)
                return function
        if not self._warned_cache_full:
            self._warned_cache_full = True
            logger.warning(
                "More than %d distinct push signatures; further new ones are applied eagerly.",
                MAX_COMPILED_SIGNATURES,
            )
        return None

    def _compile(self, signature):
        variables = [self._variables[name] for name, _ in signature]
        fused = (not any(sparse for _, sparse in signature)
                 and fused_adam.fusable(self.optimizer, variables))
        slots = [(self._slots.get((name, "momentum")), self._slots.get((name, "velocity")))
                 for name, _ in signature]
        specs = []
        for variable, (_, sparse) in zip(variables, signature):
            if sparse:
                row_shape = variable.shape[1:]
                specs += [
                    tf.TensorSpec([None, *row_shape], variable.dtype),
                    tf.TensorSpec([None], tf.int64),
                ]
            else:
                specs.append(tf.TensorSpec(variable.shape, variable.dtype))

        def apply_step(*flat):
            gradients, position = [], 0
            for variable, (_, sparse) in zip(variables, signature):
                if sparse:
                    values, ids = flat[position], flat[position + 1]
                    dense_shape = tf.constant(variable.shape.as_list(), tf.int64)
                    gradients.append(tf.IndexedSlices(values, ids, dense_shape))
                    position += 2
                else:
                    gradients.append(flat[position])
                    position += 1
            if fused:
                fused_adam.apply_step(self.optimizer, gradients, variables, slots)
            else:
                self.optimizer.apply(gradients, variables)

        # The concrete function: calling it skips the polymorphic dispatch (binding and
        # checking every argument against the signature), a millisecond a push or so.
        # Plain TensorFlow and Keras: AutoGraph converting it took 0.1 s.
        return tf.function(apply_step, input_signature=specs,
                           autograph=False).get_concrete_function()
