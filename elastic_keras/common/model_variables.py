"""Names for a Keras model's variables that every process computes alike.

The name of a variable is its Keras path ("dense/kernel"); a path that repeats gets a
"#2", "#3" ... suffix in the order of `model.weights`. Workers name what they push with
it, and the master's export finds the shards' values by it.
"""


def named_variables(model):
    """`{name: variable}` of every weight of the built `model`, in `model.weights` order."""
    named = {}
    for variable in model.weights:
        name = getattr(variable, "path", None) or variable.name
        base, n = name, 1
        while name in named:
            n += 1
            name = f"{base}#{n}"
        named[name] = variable
    return named


def split_trainable(model):
    """(`{name: trainable variable}`, `{name: non-trainable variable}`)."""
    trainable_ids = {id(v) for v in model.trainable_weights}
    trainable, fixed = {}, {}
    for name, variable in named_variables(model).items():
        (trainable if id(variable) in trainable_ids else fixed)[name] = variable
    return trainable, fixed
