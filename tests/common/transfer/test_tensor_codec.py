import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.transfer import tensor_codec
from elastic_keras.common.errors import PayloadError
from elastic_keras.proto import tensor_pb2

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 4)])
def test_dense_round_trip(dtype, shape):
    value = (np.arange(int(np.prod(shape))) - 3).reshape(shape).astype(dtype)
    decoded = tensor_codec.decode(tensor_codec.encode("v", value))
    assert decoded.dtype == np.dtype(dtype).newbyteorder("<") and decoded.shape == shape
    np.testing.assert_array_equal(decoded, value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_round_trip(dtype):
    values = np.arange(6).reshape(2, 3).astype(dtype)
    slices = tf.IndexedSlices(tf.constant(values), tf.constant([4, 1]), tf.constant([5, 3]))
    decoded = tensor_codec.decode(tensor_codec.encode("emb", slices))
    assert isinstance(decoded, tensor_codec.Slices)
    np.testing.assert_array_equal(decoded.values, values)
    assert decoded.ids.tolist() == [4, 1] and decoded.dense_shape == (5, 3)


def test_tf_tensor_and_variable_and_big_endian_input():
    assert tensor_codec.decode(tensor_codec.encode("t", tf.ones((2,)))).tolist() == [1, 1]
    assert tensor_codec.decode(tensor_codec.encode("v", tf.Variable([3.0]))).tolist() == [3]
    big = np.array([1.5, -2.0], dtype=">f4")
    wire = tensor_codec.encode("b", big)
    assert wire.content == np.array([1.5, -2.0], dtype="<f4").tobytes()
    np.testing.assert_array_equal(tensor_codec.decode(wire), big)


def test_unbounded_table_rows_take_any_int64_id():
    ids = [2**40, -7, 2**63 - 1]
    wire = tensor_codec.encode_slices("t", np.ones((3, 2), np.float32), ids, (0, 2))
    assert tensor_codec.decode(wire).ids.tolist() == ids


def test_unsupported_dtype_is_named():
    with pytest.raises(PayloadError, match="Received: dtype=complex64"):
        tensor_codec.encode("c", np.zeros(2, np.complex64))


def _ids(*ids):
    return np.array(ids, dtype="<i8").tobytes()


def _tensor(**fields):
    base = dict(name="w", dtype=tensor_pb2.DT_FLOAT32, shape=[2, 2],
                content=np.zeros(4, np.float32).tobytes())
    base.update(fields)
    return tensor_pb2.Tensor(**base)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(content=b"\0" * 15), "content must hold 16 bytes"),
        (dict(content=b"\0" * 17), "Received: 17 bytes"),
        (dict(dtype=99), "unknown dtype"),
        (dict(shape=[-1, 2]), "dimensions must be >= 0"),
        (dict(ids=_ids(0), dense_shape=[5, 2]), "one id per row"),
        (dict(ids=_ids(0, 1), dense_shape=[5, 3]), "dense_shape must be"),
        (dict(ids=_ids(0, 5), dense_shape=[5, 2]), "ids must be < 5"),
        (dict(ids=_ids(0, -1), dense_shape=[5, 2]), "ids must be >= 0"),
        (dict(ids=b"\0" * 12, dense_shape=[5, 2]), "whole int64 values"),
        (dict(ids=_ids(0, 1)), "ids need a dense_shape"),
        # 2**64 elements: an int64 product wraps to 0, which empty content would match.
        (dict(shape=[1 << 32, 1 << 32], content=b""), "at most 1099511627776 bytes"),
        (dict(shape=[1 << 40, 1 << 40, 0], content=b""), "at most"),
        (dict(ids=_ids(0, -1), dense_shape=[-5, 2]), r"dense_shape\[0\] must be >= 0"),
    ],
)
def test_bad_payloads_are_rejected(fields, message):
    with pytest.raises(PayloadError, match=message) as info:
        tensor_codec.decode(_tensor(**fields))
    assert "'w'" in str(info.value)
