"""How an ensemble's outputs combine, which model outputs can travel as predictions, and
how a prediction minibatch is read."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.transfer.tensor_codec import decode
from elastic_keras.worker.inference import Inference, _named_outputs, combine


def test_one_member_is_its_own_output():
    out = np.array([[0.2, 0.8]], np.float32)
    assert combine([out], "vote") is out


def test_mean_averages_every_output_of_the_members():
    members = [{"p": np.array([[0.0, 1.0]]), "q": np.array([2.0])},
               {"p": np.array([[1.0, 0.0]]), "q": np.array([4.0])}]
    combined = combine(members, "mean")
    np.testing.assert_allclose(combined["p"], [[0.5, 0.5]])
    np.testing.assert_allclose(combined["q"], [3.0])


def test_vote_takes_the_class_most_members_rank_first_one_hot():
    members = [np.array([[0.9, 0.1, 0.0], [0.1, 0.1, 0.8]], np.float32),
               np.array([[0.2, 0.7, 0.1], [0.0, 0.9, 0.1]], np.float32),
               np.array([[0.6, 0.3, 0.1], [0.5, 0.2, 0.3]], np.float32)]
    combined = combine(members, "vote")
    # Record 0: classes 0, 1, 0 -> 0. Record 1: 2, 1, 0 -> a tie, the lowest class.
    np.testing.assert_array_equal(combined, [[1, 0, 0], [1, 0, 0]])
    assert combined.dtype == np.float32


def test_vote_on_one_unit_outputs_is_a_majority_above_one_half():
    members = [np.array([[0.9], [0.2]]), np.array([[0.7], [0.6]]), np.array([[0.1], [0.4]])]
    np.testing.assert_array_equal(combine(members, "vote"), [[1.0], [0.0]])
    even = [np.array([0.9]), np.array([0.1])]
    np.testing.assert_array_equal(combine(even, "vote"), [0.0])  # a tie: class 0


def test_outputs_are_named_by_key_by_position_or_not_at_all():
    assert list(_named_outputs(np.zeros((2, 3)))) == [""]
    assert list(_named_outputs([np.zeros(2), np.zeros(2)])) == ["0", "1"]
    named = _named_outputs({"score": np.zeros(2), "flag": np.array([True, False])})
    assert named["flag"].dtype == np.int32


@pytest.mark.parametrize("bad", [np.array(["a", "b"]), np.float32(1.0)])
def test_outputs_that_cannot_be_predictions_are_named(bad):
    with pytest.raises(ModelSpecError, match="cannot be written as predictions"):
        _named_outputs({"out": bad})


def test_vote_on_rank_one_outputs_votes_per_record():
    members = [np.array([0.9, 0.2, 0.6]), np.array([0.7, 0.1, 0.4]), np.array([0.1, 0.3, 0.8])]
    np.testing.assert_array_equal(combine(members, "vote"), [1.0, 0.0, 1.0])


def test_small_ints_and_bfloat16_outputs_travel_widened():
    import ml_dtypes

    named = _named_outputs({"k": np.array([1, 2], np.uint8),
                            "b": np.array([0.5], ml_dtypes.bfloat16)})
    assert named["k"].dtype == np.int32 and named["b"].dtype == np.float32


class _Model:
    """A member as `Inference` uses one (a Trainer's `prepare` and `forward`), over a real
    Keras model of two inputs taken as a tuple."""

    model_version = 3

    def __init__(self):
        left, right = keras.Input((2,)), keras.Input((2,))
        self.model = keras.Model((left, right), keras.layers.Add()([left, right]))

    def prepare(self, features):
        pass

    def forward(self, features):
        return self.model(features)


@pytest.mark.parametrize("element", [
    lambda x1, x2: ((x1, x2),),                # the Keras way to give tuple inputs
    lambda x1, x2: ((x1, x2), tf.zeros([4])),  # with labels, ignored
    lambda x1, x2: ((x1, x2), tf.zeros([4]), tf.ones([4])),
])
def test_a_model_of_tuple_inputs_predicts_as_keras_reads_its_batches(element):
    x1, x2 = tf.ones([4, 2]), tf.fill([4, 2], 2.0)
    batches = tf.data.Dataset.from_tensors(element(x1, x2)).unbatch().batch(3)
    (tensor,) = Inference(spec=None, members=[_Model()]).predict(batches, num_records=4)
    np.testing.assert_array_equal(decode(tensor), np.full((4, 2), 3.0, np.float32))
