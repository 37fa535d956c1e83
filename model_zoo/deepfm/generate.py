"""A synthetic click log, Criteo-shaped, for DeepFM and for scale tests.

`python -m model_zoo.deepfm.generate --output DIR --rows N --num-shards S` writes
`DIR/data-0000i-of-0000S.tfrecord`: `tf.train.Example`s with

- `dense`: 13 float32 counts (log-normal, so heavy-tailed like Criteo's integer features);
- `cat`: 26 int64 ids, one per categorical field. Each field has `--vocab-size` values
  whose popularity follows a Zipf law (value `v` has weight `1 / (v + 1) ** 1.1`); a value is
  written as a 64-bit id hashed from (field, value), so ids look like hashed features and
  spread over the whole int64 range;
- `label`: a click (0/1) drawn from a hidden logistic model: a per-value weight for the
  first `INFORMATIVE_FIELDS` fields, dot products of per-value latent vectors for
  `INTERACTIONS` pairs of fields (the second-order signal FM layers are made for), and the
  log of the first four counts. About 30% of the rows are clicks.

The hidden model depends on `--vocab-size` and `--model-seed` only; `--seed` drives the
rows. Generate a held-out set from the same hidden model with another `--seed`:

    python -m model_zoo.deepfm.generate --output clicks/train --rows 200000 --num-shards 4
    python -m model_zoo.deepfm.generate --output clicks/test --rows 20000 --seed 1

`hidden_probabilities(dense, cat)` gives the clicks' true probabilities, to judge a model
against the best possible AUC.
"""

import argparse
import hashlib
import sys
import time

import numpy as np

from elastic_keras.data.convert import write_examples

NUM_DENSE = 13
NUM_FIELDS = 26
DEFAULT_VOCAB_SIZE = 10_000
ZIPF_EXPONENT = 1.1
INFORMATIVE_FIELDS = 10
INTERACTIONS = ((0, 1), (2, 3), (4, 5), (6, 7))
LATENT_DIM = 4
BIAS = -1.6
ROWS_PER_CHUNK = 1 << 16


class HiddenModel:
    """The click model: fixed by (vocab_size, model_seed), whatever rows are drawn."""

    def __init__(self, vocab_size=DEFAULT_VOCAB_SIZE, model_seed=0):
        rng = np.random.default_rng([model_seed, vocab_size])
        self.vocab_size = vocab_size
        self.weights = rng.normal(0.0, 0.8, (INFORMATIVE_FIELDS, vocab_size))
        fields = sorted({f for pair in INTERACTIONS for f in pair})
        self.latent = {f: rng.normal(0.0, 0.6, (vocab_size, LATENT_DIM)) for f in fields}
        self.dense_weights = rng.normal(0.0, 0.5, 4)
        weights = 1.0 / np.arange(1, vocab_size + 1) ** ZIPF_EXPONENT
        self.popularity = np.cumsum(weights / weights.sum())
        self.ids = field_value_ids(vocab_size)

    def logits(self, dense, values):
        """Logits of a click for `dense` [n, 13] counts and field `values` [n, 26] (0..V-1)."""
        logit = np.full(len(values), BIAS)
        for field in range(INFORMATIVE_FIELDS):
            logit += self.weights[field, values[:, field]]
        for a, b in INTERACTIONS:
            logit += np.sum(self.latent[a][values[:, a]] * self.latent[b][values[:, b]], axis=1)
        logit += (np.log1p(dense[:, :4]) - 1.5) @ self.dense_weights
        return logit

    def draw(self, rows, rng):
        """(dense, cat ids, values, labels) of `rows` new rows."""
        dense = np.floor(rng.lognormal(1.0, 1.2, (rows, NUM_DENSE))).astype(np.float32)
        values = np.minimum(np.searchsorted(self.popularity, rng.random((rows, NUM_FIELDS))),
                            self.vocab_size - 1)
        probabilities = 1.0 / (1.0 + np.exp(-self.logits(dense, values)))
        labels = (rng.random(rows) < probabilities).astype(np.int64)
        cat = self.ids[np.arange(NUM_FIELDS), values]
        return dense, cat, values, labels


def field_value_ids(vocab_size):
    """`[26, vocab_size]` int64 ids: a 64-bit hash (BLAKE2b) of "field:value"."""
    ids = np.empty((NUM_FIELDS, vocab_size), np.int64)
    for field in range(NUM_FIELDS):
        digests = b"".join(hashlib.blake2b(f"{field}:{value}".encode(), digest_size=8).digest()
                           for value in range(vocab_size))
        ids[field] = np.frombuffer(digests, dtype="<i8")
    return ids


def hidden_probabilities(dense, cat, vocab_size=DEFAULT_VOCAB_SIZE, model_seed=0):
    """The true click probability of rows given as written (`dense`, hashed `cat` ids)."""
    model = HiddenModel(vocab_size, model_seed)
    values = np.empty(cat.shape, np.int64)
    for field in range(NUM_FIELDS):
        order = np.argsort(model.ids[field])
        found = np.searchsorted(model.ids[field], cat[:, field], sorter=order)
        values[:, field] = order[np.minimum(found, vocab_size - 1)]
    return 1.0 / (1.0 + np.exp(-model.logits(np.asarray(dense, np.float32), values)))


def generate(output, rows, num_shards=1, vocab_size=DEFAULT_VOCAB_SIZE, seed=0, model_seed=0):
    """Writes `rows` click-log examples into `num_shards` TFRecord files under `output`.

    Returns:
        (the written files, the fraction of clicks).

    Raises:
        ValueError: `rows`, `num_shards` or `vocab_size` is not positive, or there are
            fewer rows than shards.
    """
    for name, value in (("rows", rows), ("num_shards", num_shards), ("vocab_size", vocab_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if num_shards > rows:
        raise ValueError(f"Every shard needs a row: `num_shards` must be at most `rows`. "
                         f"Received: num_shards={num_shards}, rows={rows}")
    model = HiddenModel(vocab_size, model_seed)
    rng = np.random.default_rng([seed, 1])
    parts = [model.draw(min(ROWS_PER_CHUNK, rows - start), rng)
             for start in range(0, rows, ROWS_PER_CHUNK)]
    dense, cat, _, labels = (np.concatenate(column) for column in zip(*parts))
    files = write_examples({"dense": dense, "cat": cat, "label": labels}, output, num_shards)
    return files, float(labels.mean())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m model_zoo.deepfm.generate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="The output directory.")
    parser.add_argument("--rows", type=int, required=True, help="Examples to write.")
    parser.add_argument("--num-shards", type=int, default=1, help="TFRecord files (default 1).")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help=f"Values per categorical field (default {DEFAULT_VOCAB_SIZE}).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the rows (default 0).")
    parser.add_argument("--model-seed", type=int, default=0,
                        help="Seed of the hidden click model (default 0).")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        files, click_rate = generate(args.output, args.rows, args.num_shards, args.vocab_size,
                                     args.seed, args.model_seed)
    except ValueError as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.output}: {len(files)} tfrecord files, {args.rows} rows, "
          f"{click_rate:.1%} clicks, {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
