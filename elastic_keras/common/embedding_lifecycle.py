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
  shard), or the rows of the lookup it serves where they are more; a full table evicts its
  least recently used rows first. 0: no bound.
- `--ps-max-rows-per-shard R`: a shard holds at most R rows over all its tables; past it,
  the least recently used rows of any table go. 0: no bound.

Example:

    >>> EmbeddingLifecycle(embedding_admit_after=3).embedding_admit_after
    3
    >>> EmbeddingLifecycle(embedding_admit_probability=2.0)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ConfigError: --embedding-admit-probability must be a number in (0, 1]. Received: 2.0
"""

import dataclasses
import math
import numbers

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
        "parameter servers; a full table evicts its least recently used rows, never those of "
        "the lookup it serves (a budget below one minibatch's distinct ids is exceeded by "
        "them). 0: no bound.",
    )
    ps_max_rows_per_shard: int = flag(
        0, bound=NON_NEGATIVE,
        help="The most embedding rows one parameter server holds over all its tables; past "
        "it, the least recently used rows of any table are evicted. 0: no bound.",
    )

    def __post_init__(self):
        check_fields(self)
        try:
            check_lifecycle({name: getattr(self, "embedding_" + name)
                             for name in LIFECYCLE_SETTINGS},
                            lambda name: f"--embedding-{name.replace('_', '-')}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc


LIFECYCLE_SETTINGS = ("admit_after", "admit_probability", "idle_steps", "idle_seconds",
                      "max_rows")


def check_lifecycle(settings, named=lambda name: name):
    """Checks a table's lifecycle `settings` (`{name: value}`, names from
    `LIFECYCLE_SETTINGS`; None: unset), where a layer's arguments, a shard's table and the
    job's flags come from. `named(name)` is how an error names a setting.

    Raises:
        ValueError: a setting that breaks its rule, named, with the value received.
    """
    for name, value in settings.items():
        if value is None:
            continue
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if name in ("admit_after", "idle_steps", "max_rows"):
            broken = not real or value != int(value) or value < 0 or (
                name == "admit_after" and value > MAX_ADMIT_AFTER)
            rule = "an integer from 0" + (f" to {MAX_ADMIT_AFTER}" if name == "admit_after"
                                          else "")
        elif name == "admit_probability":
            broken, rule = not real or not 0.0 < value <= 1.0, "a number in (0, 1]"
        else:
            broken = not real or not 0.0 <= value < math.inf
            rule = "a finite number of seconds, 0 or more"
        if broken:
            raise ValueError(f"{named(name)} must be {rule}. Received: {value!r}")
    after, probability = settings.get("admit_after"), settings.get("admit_probability")
    if (after or 0) > 1 and probability is not None and probability < 1.0:
        raise ValueError(f"Admission counts sightings ({named('admit_after')}) or draws "
                         f"({named('admit_probability')}), not both. Received: "
                         f"{named('admit_after')}={after}, "
                         f"{named('admit_probability')}={probability}")
