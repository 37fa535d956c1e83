"""`lifelong`: what a role's entry point imports is frozen out of the collector's scans."""

import gc
import json
import subprocess
import sys

import pytest

from elastic_keras.common.heap import lifelong


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # this test process's heap goes back to the collector
    gc.enable()


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector could free it


def test_objects_made_inside_are_frozen_and_the_collector_comes_back_on(unfrozen):
    before = gc.get_freeze_count()
    with lifelong():
        assert not gc.isenabled()
        kept = [Node() for _ in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + 2000  # each Node and its __dict__
    assert gc.is_tracked(kept[0])


def test_the_collector_stays_off_where_it_was_off_and_comes_back_after_an_error(unfrozen):
    gc.disable()
    with lifelong():
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(ImportError):
        with lifelong():
            import elastic_keras.no_such_module  # noqa: F401
    assert gc.isenabled()


def test_each_role_entry_point_freezes_tensorflow_as_it_imports_it():
    # Importing the entry modules by name runs their imports, not `main`.
    script = (
        "import gc, json, sys\n"
        "counts = {}\n"
        "for role in ('worker', 'ps', 'master'):\n"
        "    __import__(f'elastic_keras.{role}.__main__')\n"
        "    counts[role] = gc.get_freeze_count()\n"
        "print(json.dumps({'counts': counts, 'enabled': gc.isenabled(),\n"
        "                  'tensorflow': 'tensorflow' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["tensorflow"] and result["enabled"]
    assert result["counts"]["worker"] > 100_000  # TensorFlow's and Keras's modules
    assert result["counts"]["worker"] <= result["counts"]["ps"] <= result["counts"]["master"]
