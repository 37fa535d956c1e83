"""Initial values of embedding rows: a pure function of (table, id, column, initializer).

Embedding rows are created lazily, on the first lookup of an id, so a row cannot take its
value from a random generator's position in a stream: the same id must get the same row
whichever other ids share its request, in whatever order, in whichever process, and again
after a parameter server lost it. Each value is therefore drawn from a *counter-based*
generator: the 64-bit key of the row (a mix of the table name, the initializer's seed and the
id) plus a counter for the column (a pair of columns for normals, which Box-Muller draws two
at a time) and the draw goes through the SplitMix64 finaliser, and the resulting bits become
a uniform float in [0, 1), which is then transformed into the initializer's distribution.

The uniform-based and constant initializers are bit-for-bit reproducible on any machine
(only exactly rounded arithmetic is involved). The normal-based ones go through `log` and
`cos` in float64 before rounding to the table's dtype, so two machines whose math libraries
differ in the last float64 bit may, very rarely (about once per 10^8 values), differ in the
last bit of a float32 value.

Supported Keras initializers: RandomUniform, RandomNormal, TruncatedNormal, Zeros, Ones,
Constant, and the variance-scaling family (VarianceScaling, GlorotUniform, GlorotNormal,
HeUniform, HeNormal, LecunUniform, LecunNormal), whose fans are Keras's for an
`[input_dim, dim]` matrix, so they need a bounded `input_dim`.

Example:

    >>> import numpy as np
    >>> rows = initial_rows("user", np.array([7, 3]), 4, "uniform")
    >>> rows.shape, bool(np.all(np.abs(rows) <= 0.05))
    ((2, 4), True)
    >>> np.array_equal(rows[1], initial_rows("user", np.array([3]), 4, "uniform")[0])
    True
"""

import dataclasses
import functools
import hashlib
import json
import math

import numpy as np

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.hashing import mix64, table_seed

SUPPORTED = (
    "RandomUniform", "RandomNormal", "TruncatedNormal", "Zeros", "Ones", "Constant",
    "VarianceScaling", "GlorotUniform", "GlorotNormal", "HeUniform", "HeNormal",
    "LecunUniform", "LecunNormal",
)
_FAN_FREE = ("RandomUniform", "RandomNormal", "TruncatedNormal", "Zeros", "Ones", "Constant")

# Values beyond 2 stddev of a truncated normal are drawn again with the next counter; a value
# still outside after this many draws (probability about 1e-42) is clipped to the bound.
_MAX_DRAWS = 32
# Rows are generated in chunks of about this many values, to keep temporaries in cache.
_CHUNK_VALUES = 1 << 17
# Keras's factor for a normal truncated at 2 stddev to keep the variance-scaling variance.
_TRUNCATED_STDDEV_FACTOR = 0.87962566103423978

_U64 = np.uint64
_COUNTER_STRIDE = _U64(0xD1B54A32D192ED03)  # odd: distinct counters give distinct offsets
_FLOAT64_ONE_BITS = _U64(0x3FF0000000000000)


@dataclasses.dataclass(frozen=True)
class _Distribution:
    """What an initializer config means for one table: `kind` and its two parameters."""

    kind: str  # "constant" (value=a), "uniform" [a, b), "normal" or "truncated" (mean a, stddev b)
    a: float
    b: float = 0.0
    seed_key: int = 0


def check_initializer(initializer, input_dim=0):
    """Checks that `initial_rows` can generate rows for `initializer`, without generating any.

    Args:
        initializer: the dict or JSON text of `keras.initializers.serialize(init)`, or a
            Keras name such as `"uniform"`.
        input_dim: the layer's `input_dim`; 0 for an unbounded id space.

    Raises:
        ModelSpecError: Keras cannot rebuild the initializer, it is not one of `SUPPORTED`, or
            it needs fans (the variance-scaling family) and `input_dim` is 0.
    """
    _distribution(_cache_key(initializer), int(input_dim), 1)


def initial_rows(table, ids, dim, initializer, input_dim=0, dtype=np.float32):
    """The initial rows of `ids` in `table`: shape `[len(ids), dim]`, of `dtype`.

    Each row depends only on (table, id, dim, initializer, input_dim), never on the other ids
    of the call or their order.

    Args:
        table: the table's name.
        ids: int64 ids, any values (negative and beyond `input_dim` included).
        dim: the row width.
        initializer: see `check_initializer`.
        input_dim: the layer's `input_dim`, 0 for unbounded; used only for the fans.
        dtype: a floating-point numpy dtype.

    Raises:
        ModelSpecError: see `check_initializer`.
    """
    dist = _distribution(_cache_key(initializer), int(input_dim), int(dim))
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((len(ids), dim), dtype=dtype)
    if dist.kind == "constant":
        out.fill(dist.a)
        return out
    table_key = mix64(np.array([table_seed(table) ^ dist.seed_key], dtype=_U64))
    row_keys = ids.view(_U64) ^ table_key
    mix64(row_keys, out=row_keys)
    columns = np.arange(dim, dtype=_U64)
    chunk = max(1, _CHUNK_VALUES // max(dim, 1))
    for start in range(0, len(ids), chunk):
        keys = row_keys[start:start + chunk, None]
        out[start:start + chunk] = _sample(dist, keys, columns[None, :])
    return out


def _sample(dist, keys, columns):
    """Values for rows with `keys` (shape [r, 1]) at `columns` (shape [1, c]), as float64."""
    if dist.kind == "uniform":
        values = _uniform(keys, columns, 0, 0)
        values *= dist.b - dist.a
        values += dist.a
        return values
    dim = columns.shape[1]
    cosines, sines = _normal_pairs(keys, columns[:, : (dim + 1) // 2], 0)
    values = np.empty((keys.shape[0], dim))
    values[:, 0::2] = cosines
    values[:, 1::2] = sines[:, : dim // 2]
    if dist.kind == "truncated":
        outside = np.flatnonzero(np.abs(values) > 2.0)
        for draw in range(1, _MAX_DRAWS):
            if not len(outside):
                break
            row, column = np.divmod(outside, dim)
            column = column.astype(_U64)
            cosines, sines = _normal_pairs(keys[row, 0], column >> _U64(1), draw)
            again = np.where(column & _U64(1), sines, cosines)
            values.flat[outside] = again
            outside = outside[np.abs(again) > 2.0]
        np.clip(values, -2.0, 2.0, out=values)
    values *= dist.b
    values += dist.a
    return values


def _normal_pairs(keys, pairs, draw):
    """Box-Muller: two independent standard normals per (key, column pair, draw).

    Columns 2p and 2p+1 take the cosine and sine parts of pair p; the sine comes from the
    cosine through an exact square root, which is cheaper than a second `sin`.
    """
    radius = _uniform(keys, pairs, draw, 0)
    np.subtract(1.0, radius, out=radius)  # (0, 1]: its log is finite
    np.log(radius, out=radius)
    radius *= -2.0
    np.sqrt(radius, out=radius)
    turn = _uniform(keys, pairs, draw, 1)
    cosines = np.cos(turn * (2.0 * math.pi))
    sines = 1.0 - cosines * cosines
    np.maximum(sines, 0.0, out=sines)
    np.sqrt(sines, out=sines)
    np.subtract(0.5, turn, out=turn)  # the sine is negative for turns past one half
    np.copysign(sines, turn, out=sines)
    cosines *= radius
    sines *= radius
    return cosines, sines


def _uniform(keys, columns, draw, which):
    """Uniform float64 in [0, 1) for each (key, column) at counter (column, draw, which)."""
    counters = (columns * _U64(_MAX_DRAWS) + _U64(draw)) * _U64(2) + _U64(which)
    with np.errstate(over="ignore"):
        bits = keys + counters * _COUNTER_STRIDE
    mix64(bits, out=bits)
    bits >>= _U64(12)
    bits |= _FLOAT64_ONE_BITS  # 52 random mantissa bits under exponent 0: a float in [1, 2)
    values = bits.view(np.float64)
    values -= 1.0
    return values


def _cache_key(initializer):
    if isinstance(initializer, dict):
        return json.dumps(initializer, sort_keys=True)
    if isinstance(initializer, str):
        return initializer.strip()
    raise ModelSpecError(
        "An embedding initializer must be the dict or JSON of keras.initializers.serialize() "
        f"or a Keras initializer name. Received: {type(initializer).__name__} {initializer!r}"
    )


@functools.lru_cache(maxsize=256)
def _distribution(key, input_dim, dim):
    init = _keras_initializer(key)
    name = type(init).__name__
    if name not in SUPPORTED:
        raise ModelSpecError(
            f"Embedding initializer {name} is not supported for lazily created rows; use one "
            f"of {', '.join(SUPPORTED)}. Received: {key}"
        )
    config = init.get_config()
    seed_key = 0
    if config.get("seed") is not None:
        seed_json = json.dumps(config["seed"], sort_keys=True).encode("utf-8")
        seed_key = int.from_bytes(hashlib.blake2b(seed_json, digest_size=8).digest(), "little")
    if name == "Zeros":
        return _Distribution("constant", 0.0)
    if name == "Ones":
        return _Distribution("constant", 1.0)
    if name == "Constant":
        try:
            return _Distribution("constant", float(init.value))
        except (TypeError, ValueError) as exc:
            raise ModelSpecError(
                "A Constant embedding initializer needs a scalar value. "
                f"Received: value={init.value!r}"
            ) from exc
    if name == "RandomUniform":
        return _Distribution("uniform", float(init.minval), float(init.maxval), seed_key)
    if name == "RandomNormal":
        return _Distribution("normal", float(init.mean), float(init.stddev), seed_key)
    if name == "TruncatedNormal":
        return _Distribution("truncated", float(init.mean), float(init.stddev), seed_key)
    return _variance_scaling(init, name, (input_dim, dim), seed_key)


def _variance_scaling(init, name, shape, seed_key):
    input_dim = shape[0]
    if input_dim <= 0:
        raise ModelSpecError(
            f"Embedding initializer {name} scales by the table's fans, which an unbounded "
            "table (input_dim=None or 0) does not have: give the layer an input_dim or pick a "
            f"fan-free initializer ({', '.join(_FAN_FREE)}). Received: input_dim={input_dim}"
        )
    fan_in, fan_out = shape
    if init.input_axes is not None and init.output_axes is not None:
        try:  # Keras's compute_fans with explicit axes
            fan_in = math.prod(shape[axis] for axis in init.input_axes)
            fan_out = math.prod(shape[axis] for axis in init.output_axes)
        except (IndexError, TypeError) as exc:
            raise ModelSpecError(
                f"Embedding initializer {name}: input_axes and output_axes must be axes of the "
                f"table's 2-D shape {list(shape)}. Received: input_axes={init.input_axes}, "
                f"output_axes={init.output_axes}"
            ) from exc
    scale = float(init.scale)
    if init.mode == "fan_in":
        scale /= max(1.0, fan_in)
    elif init.mode == "fan_out":
        scale /= max(1.0, fan_out)
    else:
        scale /= max(1.0, (fan_in + fan_out) / 2.0)
    if init.distribution == "uniform":
        limit = math.sqrt(3.0 * scale)
        return _Distribution("uniform", -limit, limit, seed_key)
    if init.distribution == "untruncated_normal":
        return _Distribution("normal", 0.0, math.sqrt(scale), seed_key)
    return _Distribution("truncated", 0.0, math.sqrt(scale) / _TRUNCATED_STDDEV_FACTOR, seed_key)



def _keras_initializer(key):
    """Rebuilds the Keras initializer that `key` (a name or a serialized config) describes."""
    import keras  # deferred: only the first use of each config pays for it

    try:
        identifier = json.loads(key) if key.startswith("{") else key
        return keras.initializers.get(identifier)
    except Exception as exc:  # Keras raises ValueError, TypeError, KeyError, ...
        raise ModelSpecError(
            "Keras cannot rebuild the embedding initializer "
            f"({type(exc).__name__}: {exc}); use one of {', '.join(SUPPORTED)}. "
            f"Received: {key[:200]}"
        ) from exc
