"""What a parameter server accepts: bounds on requests and the rule for non-finite values.

`PayloadLimits` is the one declaration of these settings: the job's and the shards' configs
hold one as their `limits` field, and each field here is a flag of theirs, with its help
(see `config`). A shard checks every request against them before anything changes and
answers one that breaks them with INVALID_ARGUMENT; the master reads
`max_non_finite_pushes`.

Non-finite values (`--non-finite-gradients`): with "fail" a push holding any NaN or Inf in
a gradient, a delta or a table's rows is refused (`errors.NonFiniteError`), nothing of it is
applied and its sequence stays unused; with "skip" it is acknowledged (its sequence is
recorded, so it is never sent again) and nothing of it is applied; in synchronous training
it still counts in its round, as an empty (zero) contribution, so the round closes as the
workers expect. Either way the shard counts it (`Parameters.non_finite_pushes`) and reports
the count to the master with its version.

Example:

    >>> PayloadLimits().non_finite_gradients
    'fail'
    >>> PayloadLimits(max_push_bytes=0)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ConfigError: --max-push-bytes must be a positive integer. Received: 0
"""

import dataclasses

from elastic_keras.common.flags import NON_NEGATIVE, POSITIVE, check_fields, flag

NON_FINITE_RULES = ("fail", "skip")


@dataclasses.dataclass(frozen=True)
class PayloadLimits:
    """`--max-push-bytes`, `--max-variable-elements`, `--max-embedding-dim`,
    `--non-finite-gradients` and `--max-non-finite-pushes`.

    Raises:
        ConfigError: a value outside its rule, naming its flag and the value.
    """

    max_push_bytes: int = flag(
        1 << 30, bound=POSITIVE,
        help="The most bytes a parameter server reads of one push (its gradients on the wire, "
        "and again uncompressed); a larger push is refused as it streams in.",
    )
    max_variable_elements: int = flag(
        1 << 31, bound=POSITIVE,
        help="The most elements of one dense variable a parameter server takes at InitModel.",
    )
    max_embedding_dim: int = flag(
        65536, bound=POSITIVE,
        help="The widest embedding-table row a parameter server takes at InitModel.",
    )
    non_finite_gradients: str = flag(
        "fail", choices=NON_FINITE_RULES,
        help="What a parameter server does with a push holding NaN or Inf: fail (refuse it; "
        "the worker's task fails) or skip (acknowledge it and apply none of it). Counted "
        "either way.",
    )
    max_non_finite_pushes: int = flag(
        10, bound=NON_NEGATIVE,
        help="The master stops the job once the parameter servers have counted more pushes "
        "holding NaN or Inf than this; 0: no limit.",
    )

    def __post_init__(self):
        check_fields(self)

    @property
    def skip_non_finite(self):
        """Whether a push holding NaN or Inf is acknowledged and skipped (else refused)."""
        return self.non_finite_gradients == "skip"
