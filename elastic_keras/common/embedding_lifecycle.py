"""The job's defaults for how embedding tables keep their size: admission, eviction, budgets.

`EmbeddingLifecycle` is the one declaration of these settings: the job's and the shards'
configs hold one as their `lifecycle` field, and each field here is a flag of theirs. A
table takes each setting from its layer (`elastic_keras.layers.Embedding(admit_after=...)`)
where the layer sets it, and from these flags where it does not:

- `--embedding-admit-after N`: an id gets a row once looked up in training N times; until
  then it reads zeros and its gradients are dropped (counted). 0 or 1: at first sight.
- `--embedding-admit-probability p`: or each such lookup gives it a row with probability p.
- `--embedding-idle-steps T`: rows not used in training for T model versions of their shard
  are evicted. 0: never. `--embedding-idle-seconds S`: or for S seconds.
- `--embedding-max-rows R`: each table holds at most R rows over all shards (R / num-ps per
  shard); a full table evicts its least recently used rows first. 0: no bound.
- `--ps-max-rows-per-shard R`: a shard holds at most R rows over all its tables; past it,
  the least recently used rows of any table go. 0: no bound.

Example:

    >>> EmbeddingLifecycle(embedding_admit_after=3).embedding_admit_after
    3
    >>> EmbeddingLifecycle(embedding_admit_probability=2.0)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ConfigError: --embedding-admit-probability must lie in (0, 1]. Received: 2.0
"""

import dataclasses
import math

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.flags import NON_NEGATIVE, check_fields, flag

MAX_ADMIT_AFTER = 255  # sightings are counted in 8-bit counters


@dataclasses.dataclass(frozen=True)
class EmbeddingLifecycle:
    """`--embedding-admit-after`, `--embedding-admit-probability`, `--embedding-idle-steps`,
    `--embedding-idle-seconds`, `--embedding-max-rows` and `--ps-max-rows-per-shard`.

    Raises:
        ConfigError: a value outside its rule, naming its flag and the value.
    """

    embedding_admit_after: int = flag(
        0, bound=NON_NEGATIVE,
        help="Tables without their own admit_after: an id gets a row once it was looked up in "
        f"training this many times (at most {MAX_ADMIT_AFTER}); until then it reads zeros and "
        "its gradients are dropped, counted. 0 or 1: at first sight.",
    )
    embedding_admit_probability: float = flag(
        1.0, help="Tables without their own admit_after or admit_probability: each training "
        "lookup of an id without a row gives it one with this probability.",
    )
    embedding_idle_steps: int = flag(
        0, bound=NON_NEGATIVE,
        help="Tables without their own idle_steps: rows not used in training for this many "
        "model versions of their shard are evicted. 0: never.",
    )
    embedding_idle_seconds: float = flag(
        0.0, bound=NON_NEGATIVE,
        help="Tables without their own idle_seconds: rows not used in training for this many "
        "seconds are evicted (checked every sixteenth of it). 0: never.",
    )
    embedding_max_rows: int = flag(
        0, bound=NON_NEGATIVE,
        help="Tables without their own max_rows: the most rows a table holds over all "
        "parameter servers; a full table evicts its least recently used rows. 0: no bound.",
    )
    ps_max_rows_per_shard: int = flag(
        0, bound=NON_NEGATIVE,
        help="The most embedding rows one parameter server holds over all its tables; past "
        "it, the least recently used rows of any table are evicted. 0: no bound.",
    )

    def __post_init__(self):
        check_fields(self)
        p = self.embedding_admit_probability
        if not math.isfinite(self.embedding_idle_seconds):
            raise ConfigError(f"--embedding-idle-seconds must be a finite number of seconds. "
                              f"Received: {self.embedding_idle_seconds!r}")
        if not 0.0 < p <= 1.0:
            raise ConfigError(f"--embedding-admit-probability must lie in (0, 1]. Received: {p!r}")
        if self.embedding_admit_after > MAX_ADMIT_AFTER:
            raise ConfigError(f"--embedding-admit-after must be at most {MAX_ADMIT_AFTER}. "
                              f"Received: {self.embedding_admit_after}")
        if self.embedding_admit_after > 1 and p < 1.0:
            raise ConfigError(
                "Admission counts sightings or draws, not both: give --embedding-admit-after "
                "or --embedding-admit-probability. Received: "
                f"--embedding-admit-after {self.embedding_admit_after} "
                f"--embedding-admit-probability {p}"
            )
