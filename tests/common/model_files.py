"""Model-zoo modules written for the tests of `model_spec` and `module_loader`: a complete,
valid module, and ways to drop or replace its definitions."""

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A complete, valid module; tests drop or replace single definitions of it.
PARTS = {
    "imports": "import keras\n",
    "custom_model": (
        "def custom_model():\n"
        "    inputs = keras.Input(shape=(3,))\n"
        "    return keras.Model(inputs, keras.layers.Dense(2)(inputs))\n"
    ),
    "loss": "def loss(labels, predictions):\n    return 0.0\n",
    "optimizer": "def optimizer():\n    return keras.optimizers.SGD(0.1)\n",
    "dataset_fn": "def dataset_fn(dataset, mode, metadata):\n    return dataset\n",
}
OPTIONAL_PARTS = {
    "eval_metrics_fn": (
        "def eval_metrics_fn():\n"
        "    return {'accuracy': keras.metrics.SparseCategoricalAccuracy()}\n"
    ),
    "callbacks": "def callbacks():\n    return []\n",
    "PredictionOutputsProcessor": (
        "class PredictionOutputsProcessor:\n"
        "    def process(self, predictions, worker_id):\n"
        "        return predictions\n"
    ),
}

_counter = iter(range(10**6))


def unique(prefix):
    """A module name no other test uses, so `sys.modules` never hands back another's."""
    return f"{prefix}_{next(_counter)}"


def module_source(drop=(), optional=False, **replace):
    parts = dict(PARTS, **(OPTIONAL_PARTS if optional else {}))
    for name in drop:
        del parts[name]
    parts.update(replace)
    return "\n".join(textwrap.dedent(text) for text in parts.values())


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_module(zoo, name=None, **kwargs):
    name = name or unique("model")
    write(zoo / f"{name}.py", module_source(**kwargs))
    return name
