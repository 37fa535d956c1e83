"""How a worker tells a failed task: one line with the user's frame, and whether it is fatal."""

from elastic_keras.common.errors import (
    DataError, ModelSpecError, NonFiniteLossError, PushRefused,
)
from elastic_keras.worker import failures

TRACED = ('in user code:\n\n    File "/site/elastic_keras/worker/trainer.py", line 9, in step  *\n'
          '        loss = self._spec.loss(labels, predictions)\n'
          '    File "/zoo/m.py", line 12, in loss  *\n        return x - y\n\n'
          '    ValueError: Dimensions must be equal, but are 3 and 2')


def test_a_traced_error_is_its_last_line_and_the_users_frame():
    assert failures.describe(ValueError(TRACED)) == (
        "ValueError: Dimensions must be equal, but are 3 and 2 (at /zoo/m.py:12 in loss)")


def user_code():
    raise KeyError("label")


def test_a_python_error_names_the_innermost_user_frame_of_its_traceback():
    try:
        user_code()
    except KeyError as exc:
        described = failures.describe(exc)
    assert described.startswith(f"KeyError: 'label' (at {__file__}:")
    assert described.endswith(" in user_code)")


def test_a_long_message_is_cut_and_stays_one_line():
    described = failures.describe(DataError("x" * 5000 + "\nmore"))
    assert len(described) == failures.MAX_CHARS and "\n" not in described


def test_what_fails_the_job_at_once():
    nan = NonFiniteLossError("The training loss is nan")
    refused = PushRefused("The training loss is nan", {1: "non_finite_loss"})
    refused.__cause__ = nan
    assert failures.fatal(ModelSpecError("bad")) == failures.MODEL_MODULE
    assert failures.fatal(nan) == failures.fatal(refused) == failures.NON_FINITE_LOSS
    assert failures.fatal(nan, "skip") == failures.fatal(refused, "skip") == ""
    assert failures.fatal(DataError("bad record")) == failures.fatal(ValueError()) == ""
