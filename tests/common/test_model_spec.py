"""Tests of checking model-zoo modules against the contract (elastic_keras.common.model_spec);
importing them is tested in test_module_loader."""

import dataclasses

import keras
import pytest

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.model_spec import (
    Mode,
    ModelSpec,
    check_model_spec,
    load_model_spec,
)
from tests.common.model_files import REPO, module_source, unique, write, write_module

pytestmark = pytest.mark.usefixtures("restore_sys_path")


# --- Mode ---------------------------------------------------------------------------------


def test_mode_equals_the_plain_strings():
    assert Mode.TRAINING == "training"
    assert Mode.EVALUATION == "evaluation"
    assert Mode.PREDICTION == "prediction"
    assert Mode("prediction") is Mode.PREDICTION
    assert f"{Mode.TRAINING}" == "training" and str(Mode.EVALUATION) == "evaluation"


# --- What a loaded module's spec holds -------------------------------------------------------


def test_loads_a_top_level_module(tmp_path):
    name = write_module(tmp_path, optional=True)
    spec = load_model_spec(str(tmp_path), name)
    assert isinstance(spec, ModelSpec)
    assert spec.module_name == name
    assert spec.custom_model.__name__ == "custom_model"
    assert spec.loss.__name__ == "loss"
    assert spec.optimizer.__name__ == "optimizer"
    assert spec.dataset_fn.__name__ == "dataset_fn"
    assert spec.eval_metrics_fn.__name__ == "eval_metrics_fn"
    assert spec.callbacks.__name__ == "callbacks"
    assert spec.prediction_outputs_processor.__name__ == "PredictionOutputsProcessor"
    spec.check()
    check_model_spec(spec)


def test_optional_names_are_none_when_absent(tmp_path):
    spec = load_model_spec(str(tmp_path), write_module(tmp_path))
    assert spec.eval_metrics_fn is None
    assert spec.callbacks is None
    assert spec.prediction_outputs_processor is None
    spec.check()


def test_a_last_part_naming_a_function_is_the_model_function(tmp_path):
    pkg = unique("pkg")
    write(tmp_path / pkg / "__init__.py", "")
    write(
        tmp_path / pkg / "models.py",
        module_source(drop=("custom_model",))
        + "def wide_model():\n"
        "    inputs = keras.Input(shape=(5,))\n"
        "    return keras.Model(inputs, keras.layers.Dense(1)(inputs))\n",
    )
    spec = load_model_spec(str(tmp_path), f"{pkg}.models.wide_model")
    assert spec.module_name == f"{pkg}.models"
    assert spec.custom_model.__name__ == "wide_model"
    spec.check()


def test_a_named_model_function_that_is_not_callable(tmp_path):
    name = write_module(tmp_path, extra="my_model = 3\n")
    with pytest.raises(ModelSpecError) as info:
        load_model_spec(str(tmp_path), f"{name}.my_model")
    assert f"'{name}'" in str(info.value)
    assert "callable `my_model()`" in str(info.value)
    assert str(info.value).endswith("Received: my_model = 3 (int)")


def test_loads_the_example_zoo_both_ways():
    for model_def in ("mnist.mnist_subclass", "mnist.mnist_functional", "digits.digits_cnn"):
        spec = load_model_spec(str(REPO / "model_zoo"), model_def)
        assert spec.module_name == model_def
        assert spec.eval_metrics_fn is not None
        assert spec.prediction_outputs_processor is not None
        spec.check()
    spec = load_model_spec(str(REPO), "model_zoo.mnist.mnist_subclass")
    assert spec.dataset_fn.__module__ == "model_zoo.mnist.mnist_functional"
    spec = load_model_spec(".", str(REPO / "model_zoo" / "mnist" / "mnist_subclass.py"))
    spec.check()
    keras.utils.clear_session()


# --- Missing, non-callable and wrong required names ------------------------------------------


@pytest.mark.parametrize(
    "name, shown",
    [
        ("custom_model", "`custom_model()`"),
        ("loss", "`loss(labels, predictions)`"),
        ("optimizer", "`optimizer()`"),
        ("dataset_fn", "`dataset_fn(dataset, mode, metadata)` (or its alias `feed`, or "
                       "`batch_dataset_fn(dataset, mode, metadata)`)"),
    ],
)
def test_a_missing_required_name(tmp_path, name, shown):
    module = write_module(tmp_path, drop=(name,))
    with pytest.raises(ModelSpecError) as info:
        load_model_spec(str(tmp_path), module)
    message = str(info.value)
    assert f"Model module '{module}' does not define {shown}" in message
    assert f"Received: a module ({tmp_path.resolve() / module}.py) without `{name}`" in message


@pytest.mark.parametrize("name", ["custom_model", "loss", "optimizer", "dataset_fn"])
def test_a_required_name_that_is_not_callable(tmp_path, name):
    module = write_module(tmp_path, **{name: f"{name} = 3\n"})
    with pytest.raises(ModelSpecError) as info:
        load_model_spec(str(tmp_path), module)
    message = str(info.value)
    assert message.startswith(f"Model module '{module}' must define a callable `{name}")
    assert message.endswith(f"Received: {name} = 3 (int)")


def test_a_function_with_the_wrong_arguments(tmp_path):
    module = write_module(tmp_path, loss="def loss(labels):\n    return 0.0\n")
    with pytest.raises(ModelSpecError) as info:
        load_model_spec(str(tmp_path), module)
    assert "`loss(labels, predictions)`, callable with 2 positional arguments" in str(info.value)
    assert str(info.value).endswith("Received: loss(labels)")


def test_feed_is_an_alias_of_dataset_fn(tmp_path):
    module = write_module(
        tmp_path,
        dataset_fn="def feed(dataset, mode, metadata):\n    return dataset\n",
    )
    spec = load_model_spec(str(tmp_path), module)
    assert spec.dataset_fn.__name__ == "feed"


def test_dataset_fn_wins_over_feed(tmp_path):
    module = write_module(tmp_path, extra="def feed(dataset, mode, metadata):\n    return 1\n")
    assert load_model_spec(str(tmp_path), module).dataset_fn.__name__ == "dataset_fn"


BATCH_PARSER = "def batch_dataset_fn(dataset, mode, metadata):\n    return dataset\n"


def test_batch_dataset_fn_alone_is_enough(tmp_path):
    module = write_module(tmp_path, dataset_fn=BATCH_PARSER)
    spec = load_model_spec(str(tmp_path), module)
    assert spec.dataset_fn is None
    assert spec.batch_dataset_fn.__name__ == "batch_dataset_fn"


def test_a_module_may_define_both_input_functions(tmp_path):
    spec = load_model_spec(str(tmp_path), write_module(tmp_path, extra=BATCH_PARSER))
    assert spec.dataset_fn.__name__ == "dataset_fn"
    assert spec.batch_dataset_fn.__name__ == "batch_dataset_fn"


def test_an_unusable_batch_dataset_fn(tmp_path):
    module = write_module(tmp_path, extra="batch_dataset_fn = 2\n")
    with pytest.raises(ModelSpecError, match=r"callable `batch_dataset_fn\(dataset, mode, "
                                             r"metadata\)`. Received: batch_dataset_fn = 2"):
        load_model_spec(str(tmp_path), module)
    module = write_module(tmp_path, dataset_fn="def batch_dataset_fn(dataset):\n    pass\n")
    with pytest.raises(ModelSpecError, match=r"callable with 3 positional arguments. "
                                             r"Received: batch_dataset_fn\(dataset\)"):
        load_model_spec(str(tmp_path), module)


def test_a_feed_that_is_not_callable(tmp_path):
    module = write_module(tmp_path, dataset_fn="feed = 'x'\n")
    with pytest.raises(ModelSpecError, match=r"callable `feed\(.*Received: feed = 'x' \(str\)"):
        load_model_spec(str(tmp_path), module)


def test_unusable_optional_names(tmp_path):
    module = write_module(tmp_path, extra="eval_metrics_fn = {}\n")
    with pytest.raises(ModelSpecError, match=r"callable `eval_metrics_fn\(\)`"):
        load_model_spec(str(tmp_path), module)
    module = write_module(tmp_path, extra="class PredictionOutputsProcessor:\n    pass\n")
    with pytest.raises(ModelSpecError, match=r"`PredictionOutputsProcessor` as a class"):
        load_model_spec(str(tmp_path), module)


# --- ModelSpec.check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, received",
    [
        ("return 'adam'", "Received: 'adam' (str)"),
        ("return keras.optimizers.Adam", "(type)"),
        ("return keras.losses.MeanSquaredError()", "(MeanSquaredError)"),
    ],
)
def test_check_rejects_an_optimizer_that_is_not_one(tmp_path, body, received):
    module = write_module(tmp_path, optimizer=f"def optimizer():\n    {body}\n")
    spec = load_model_spec(str(tmp_path), module)
    with pytest.raises(ModelSpecError) as info:
        spec.check()
    message = str(info.value)
    assert message.startswith(
        f"Model module '{module}': `optimizer()` must return a keras.optimizers.Optimizer."
    )
    assert message.endswith(received)


def test_check_reports_an_optimizer_that_raises(tmp_path):
    module = write_module(
        tmp_path, optimizer="def optimizer():\n    raise RuntimeError('no optimizer today')\n"
    )
    spec = load_model_spec(str(tmp_path), module)
    with pytest.raises(ModelSpecError) as info:
        spec.check()
    assert f"'{module}': `optimizer()` must run without error" in str(info.value)
    assert str(info.value).endswith("Received: RuntimeError: no optimizer today")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_check_rejects_a_model_function_that_returns_no_model(tmp_path):
    module = write_module(
        tmp_path, custom_model="def custom_model():\n    return keras.layers.Dense(3)\n"
    )
    spec = load_model_spec(str(tmp_path), module)
    with pytest.raises(ModelSpecError, match=r"`custom_model\(\)` must return a keras\.Model") as e:
        spec.check()
    assert str(e.value).endswith("(Dense)")


def test_check_accepts_sequential_and_subclassed_models(tmp_path):
    module = write_module(
        tmp_path,
        custom_model=(
            "class Net(keras.Model):\n"
            "    def call(self, x):\n"
            "        return x\n"
            "def custom_model():\n"
            "    return keras.Sequential([keras.layers.Dense(1)])\n"
            "def subclassed():\n"
            "    return Net()\n"
        ),
    )
    load_model_spec(str(tmp_path), module).check()
    load_model_spec(str(tmp_path), f"{module}.subclassed").check()


def test_check_rejects_bad_metrics_and_callbacks(tmp_path):
    module = write_module(tmp_path, extra="def eval_metrics_fn():\n    return ['accuracy']\n")
    with pytest.raises(ModelSpecError, match=r"`eval_metrics_fn\(\)` must return a dict"):
        load_model_spec(str(tmp_path), module).check()
    module = write_module(tmp_path, extra="def callbacks():\n    return 7\n")
    with pytest.raises(ModelSpecError, match=r"`callbacks\(\)` must return a list.*7 \(int\)"):
        load_model_spec(str(tmp_path), module).check()


def test_check_refuses_a_loss_scale_optimizer_by_name(tmp_path):
    module = write_module(tmp_path, optimizer=(
        "def optimizer():\n"
        "    return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))\n"))
    spec = load_model_spec(str(tmp_path), module)
    with pytest.raises(ModelSpecError) as info:
        spec.check()
    assert str(info.value).startswith(f"Model module '{module}': optimizer() returned a "
                                      "LossScaleOptimizer")
    assert "loss_scale_factor" in str(info.value)


def test_check_refuses_a_custom_optimizer_subclass_by_name(tmp_path):
    module = write_module(tmp_path, optimizer=(
        "class MyAdam(keras.optimizers.Adam):\n"
        "    pass\n\n\n"
        "def optimizer():\n"
        "    return MyAdam(0.1)\n"))
    spec = load_model_spec(str(tmp_path), module)
    with pytest.raises(ModelSpecError) as info:
        spec.check()
    assert str(info.value).startswith(f"Model module '{module}': optimizer() must return one "
                                      "of Keras's built-in optimizers")
    assert str(info.value).endswith(f"Received: {module}.MyAdam")


# --- What shows only while training: dataset_fn's elements, the loss's shape ----------------


def _spec(dataset_fn=lambda dataset, mode, metadata: dataset):
    return ModelSpec("m", keras.Sequential, lambda labels, predictions: 0.0,
                     lambda: keras.optimizers.SGD(0.1), dataset_fn)


def test_apply_dataset_fn_returns_a_dataset_of_pairs():
    import tensorflow as tf

    pairs = tf.data.Dataset.from_tensor_slices(([1.0, 2.0], [0, 1]))
    assert _spec().apply_dataset_fn(pairs, Mode.TRAINING, None) is pairs
    features = tf.data.Dataset.from_tensor_slices([1.0, 2.0])
    assert _spec().apply_dataset_fn(features, Mode.PREDICTION, None) is features


@pytest.mark.parametrize("returned, received", [
    (lambda tf: tf.data.Dataset.from_tensor_slices([[1.0, 2.0]]),
     "a dataset of single float32 tensors of shape (2,)"),
    (lambda tf: tf.data.Dataset.from_tensor_slices({"x": [1.0], "y": [2.0]}),
     "a dataset of dicts with keys ['x', 'y']"),
    (lambda tf: tf.data.Dataset.from_tensor_slices(([1.0], [2.0], [3.0])),
     "a dataset of tuples of 3"),
    (lambda tf: [1, 2], "[1, 2] (list)"),
])
def test_apply_dataset_fn_names_what_dataset_fn_yields(returned, received):
    import tensorflow as tf

    spec = _spec(lambda dataset, mode, metadata: returned(tf))
    with pytest.raises(ModelSpecError) as info:
        spec.apply_dataset_fn(tf.data.Dataset.range(1), Mode.EVALUATION, None)
    assert str(info.value).startswith(
        "Model module 'm': `dataset_fn(dataset, mode='evaluation', metadata)` must return ")
    assert str(info.value).endswith(f"Received: {received}")


def test_a_prediction_dataset_is_read_as_keras_predict_reads_one():
    import tensorflow as tf

    for element in ([1.0], ([1.0],), ([1.0], [0]), ([1.0], [0], [1.0])):
        dataset = tf.data.Dataset.from_tensor_slices(element)
        assert _spec().apply_dataset_fn(dataset, Mode.PREDICTION, None) is dataset
    four = tf.data.Dataset.from_tensor_slices(([1.0], [0], [1.0], [2.0]))
    with pytest.raises(ModelSpecError, match=r"\(\(x1, x2\),\)\)\. Received: a dataset of "
                                             r"tuples of 4"):
        _spec().apply_dataset_fn(four, Mode.PREDICTION, None)


def test_check_loss_takes_scalars_and_refuses_tensors_with_their_shape():
    import numpy as np
    import tensorflow as tf

    spec = _spec()
    for loss in (0.5, np.float32(0.5), tf.constant(0.5), tf.TensorSpec(None)):
        spec.check_loss(loss)  # a rank unknown while tracing passes
    for loss, shape in ((tf.zeros([4]), "(4,)"), (tf.TensorSpec([None, 1]), "(None, 1)")):
        with pytest.raises(ModelSpecError) as info:
            spec.check_loss(loss)
        assert "`loss(labels, predictions)` must return a scalar" in str(info.value)
        assert str(info.value).endswith(f"Received: a tensor of shape {shape}")


def _records(n):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices([str(i).encode() for i in range(n)])


def _parse_one(dataset, mode, metadata):
    import tensorflow as tf

    return dataset.map(lambda r: (tf.strings.to_number(r), tf.strings.length(r)))


def test_minibatches_batch_what_dataset_fn_parses_one_record_at_a_time():
    spec = _spec(_parse_one)
    batches = [x.numpy().tolist() for x, _ in spec.minibatches(_records(5), Mode.TRAINING,
                                                                None, 2)]
    assert batches == [[0.0, 1.0], [2.0, 3.0], [4.0]]


def test_minibatches_hand_batch_dataset_fn_whole_minibatches_of_records():
    import tensorflow as tf

    seen = []

    def parse_batch(dataset, mode, metadata):
        seen.append((dataset.element_spec, mode))
        return dataset.map(lambda r: (tf.strings.to_number(r), tf.strings.length(r)))

    spec = dataclasses.replace(_spec(None), batch_dataset_fn=parse_batch)
    batches = [x.numpy().tolist() for x, _ in spec.minibatches(_records(5), Mode.TRAINING,
                                                                None, 2)]
    assert batches == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert seen == [(tf.TensorSpec([None], tf.string), "training")]
    both = dataclasses.replace(_spec(_parse_one), batch_dataset_fn=parse_batch)
    both.minibatches(_records(5), Mode.EVALUATION, None, 2)
    assert len(seen) == 2  # with both, the batched one is used


@pytest.mark.parametrize("returned, received", [
    (lambda d: d.unbatch().map(lambda r: (r, r)),
     "Received: a dataset whose elements hold a scalar (TensorSpec(shape=(), "),
    (lambda d: d, "must return a dataset of (features, labels) pairs"),
    (lambda d: 7, "must return a tf.data.Dataset. Received: 7 (int)"),
])
def test_minibatches_name_what_batch_dataset_fn_yields(returned, received):
    spec = dataclasses.replace(_spec(None), batch_dataset_fn=lambda d, mode, m: returned(d))
    with pytest.raises(ModelSpecError) as info:
        spec.minibatches(_records(3), Mode.TRAINING, None, 2)
    assert str(info.value).startswith(
        "Model module 'm': `batch_dataset_fn(dataset, mode='training', metadata)` must ")
    assert received in str(info.value)
