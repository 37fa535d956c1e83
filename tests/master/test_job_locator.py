import json
import os
import subprocess
import sys

import pytest

from elastic_keras.common.errors import ConfigError
from elastic_keras.master import job_locator


def test_a_registered_job_is_found_until_it_unregisters(tmp_path):
    job_locator.register("job/a b", "127.0.0.1:5000", home=str(tmp_path))
    entry = job_locator.find("job/a b", home=str(tmp_path))
    assert entry["address"] == "127.0.0.1:5000" and entry["pid"] == os.getpid()
    job_locator.unregister("job/a b", home=str(tmp_path))
    with pytest.raises(ConfigError, match="no master of that name has run here"):
        job_locator.find("job/a b", home=str(tmp_path))


def test_the_entry_of_a_dead_master_is_stale(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    path = job_locator.jobs_dir(str(tmp_path))
    os.makedirs(path)
    with open(os.path.join(path, "old.json"), "w") as f:
        json.dump({"job_name": "old", "address": "127.0.0.1:1", "pid": int(dead.stdout)}, f)
    job_locator.register("live", "127.0.0.1:2", home=str(tmp_path))
    with pytest.raises(ConfigError, match=r"its master has exited\). Running jobs: live"):
        job_locator.find("old", home=str(tmp_path))


def test_unregister_leaves_another_masters_entry(tmp_path):
    path = job_locator.jobs_dir(str(tmp_path))
    os.makedirs(path)
    with open(os.path.join(path, "j.json"), "w") as f:
        json.dump({"job_name": "j", "address": "127.0.0.1:1", "pid": os.getppid()}, f)
    job_locator.unregister("j", home=str(tmp_path))
    assert job_locator.find("j", home=str(tmp_path))["pid"] == os.getppid()


def test_an_unwritable_registry_does_not_raise(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    job_locator.register("j", "127.0.0.1:1", home=str(blocker))
    assert "Could not record the job" in caplog.text
