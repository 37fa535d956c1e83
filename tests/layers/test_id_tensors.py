"""Id tensors of the embedding layers (layers/id_tensors.py): flat ids and segments of dense,
ragged and sparse inputs, shaped back; id-range and table-row checks."""

import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.layers.id_tensors import check_id_range, check_table_rows, segments


@pytest.mark.parametrize("inputs, ids, rows, shape", [
    (tf.constant([[1, 2], [3, 4], [5, 6]]), [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 2, 2], (3, 2)),
    (tf.ragged.constant([[1], [2, 3], []]), [1, 2, 3], [0, 1, 1], (3, 2)),
    (tf.sparse.SparseTensor([[0, 0], [2, 1]], [7, 8], [3, 2]), [7, 8], [0, 2], (3, 2)),
])
def test_segments_flatten_ids_and_finish_reshapes_one_vector_per_row(inputs, ids, rows, shape):
    values, segment_ids, count, finish = segments(inputs)
    assert values.numpy().tolist() == ids and segment_ids.numpy().tolist() == rows
    combined = tf.math.unsorted_segment_sum(tf.ones([len(ids), 2]), segment_ids, count)
    assert tuple(finish(combined).shape) == shape


def test_ids_out_of_range_fail_in_the_graph_with_the_layer_named():
    with pytest.raises(tf.errors.InvalidArgumentError, match="'user'.*input_dim=5"):
        check_id_range(tf.constant([1, 5], tf.int64), 5, "user")
    assert check_id_range(tf.constant([-3], tf.int64), None, "user").numpy().tolist() == [-3]


def test_table_rows_are_checked_for_shape_repeats_and_range():
    ids, rows, default = check_table_rows("t", [2, 0], np.ones((2, 3)), None, 3, 4, np.float32)
    assert ids.dtype == np.int64 and rows.dtype == np.float32 and not default.any()
    with pytest.raises(ValueError, match=r"shape \[len\(ids\), output_dim\] = \[2, 3\]"):
        check_table_rows("t", [2, 0], np.ones((2, 4)), None, 3, 4, np.float32)
    with pytest.raises(ValueError, match="distinct"):
        check_table_rows("t", [1, 1], np.ones((2, 3)), None, 3, 4, np.float32)
    with pytest.raises(ValueError, match=r"\[0, input_dim=4\).*max=9"):
        check_table_rows("t", [9], np.ones((1, 3)), None, 3, 4, np.float32)
