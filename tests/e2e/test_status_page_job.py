"""The status page of a real MNIST job (2 workers, 1 PS, local processes), loaded in headless
Chromium (the Debian package; `.ci/run` installs it) while the job trains and after a worker
was SIGKILLed: the workers table, a drawn loss chart and the failure; `/metrics` parsed with
prometheus_client; `elastic-keras status` and `--json`. A screenshot is written to
build/screenshots/status_page.png for people to look at."""

import html.parser
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.master.test_tensorboard import read_scalars
from tests.e2e.conftest import job_processes, run_cli, start_cli

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = ROOT / "build" / "screenshots" / "status_page.png"
JOB = "status-page-e2e"


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def _wait_for(condition, what, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _chromium(*args):
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120)


class _Page(html.parser.HTMLParser):
    """The text of each table's rows, and the `d` of each chart's series path."""

    def __init__(self):
        super().__init__()
        self.tables, self.charts = {}, {}
        self._table = self._svg = None
        self._row = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id")
            self.tables[self._table] = []
        elif tag == "svg":
            self._svg = attrs.get("id")
        elif tag == "path" and attrs.get("class") == "series":
            self.charts[self._svg] = attrs.get("d", "")
        elif tag == "tr" and self._table:
            self._row = []

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            self.tables[self._table].append(" ".join(self._row))
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._row is not None and data.strip():
            self._row.append(data.strip())


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_the_status_page_shows_a_running_job_in_a_real_browser(mnist_records, tmp_path):
    env = {"ELASTIC_KERAS_HOME": str(tmp_path / "home")}
    job = start_cli(
        "train", "--model-zoo", ROOT / "model_zoo", "--model-def", "mnist.mnist_functional",
        "--training-data", mnist_records / "train", "--validation-data", mnist_records / "test",
        "--num-workers", "2", "--num-epochs", "4", "--minibatch-size", "32",
        "--job-name", JOB, "--output", tmp_path / "out", log_path=tmp_path / "job.log", env=env)
    try:
        entry = tmp_path / "home" / "jobs" / f"{JOB}.json"
        url = _wait_for(lambda: entry.exists() and json.loads(entry.read_text())["status_url"],
                        "the master's status page")
        snapshot = lambda: json.loads(_get(url + "status.json"))  # noqa: E731
        _wait_for(lambda: sum(p["loss"] is not None for p in snapshot()["series"]) >= 3,
                  "three loss points")
        victim = next(pid for pid, cmd in job_processes(JOB).items()
                      if "elastic_keras.worker" in cmd and "--worker-id 1 " in cmd)
        os.kill(victim, signal.SIGKILL)
        _wait_for(lambda: any(e["role"] == "worker-1" for e in snapshot()["events"]),
                  "the failure on the page")

        page = _Page()
        page.feed(_chromium("--dump-dom", url).stdout)
        workers = page.tables["workers"][1:]
        assert any(r.startswith("worker-0 running 127.0.0.1") for r in workers), workers
        assert any(r.startswith("worker-1") for r in workers), workers
        assert page.tables["ps"][1].startswith("ps-0 running 127.0.0.1:"), page.tables["ps"]
        assert any("worker-1" in r and "killed" in r for r in page.tables["events"]), \
            page.tables["events"]
        assert page.charts["loss-chart"].count("L") >= 2  # a drawn line, not an empty chart
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        _chromium("--window-size=1280,1300", f"--screenshot={SCREENSHOT}", url)
        assert SCREENSHOT.stat().st_size > 10_000

        families = {f.name: f for f in text_string_to_metric_families(_get(url + "metrics"))}
        assert families["elastic_keras_examples_per_second"].samples[0].labels == {"job": JOB}
        assert families["elastic_keras_relaunches"].samples[0].labels["role"] == "worker-1"
        assert families["elastic_keras_ps_memory_bytes"].samples[0].value > 0
        assert families["elastic_keras_ps_bytes_received"].samples[0].value > 0

        text = run_cli("status", "--job-name", JOB, env=env)
        assert text.returncode == 0 and f"Job {JOB} (train, engine local)" in text.stdout
        as_json = run_cli("status", "--job-name", JOB, "--json", env=env)
        assert json.loads(as_json.stdout)["job"]["name"] == JOB
        assert job.wait(timeout=300) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
    gone = run_cli("status", "--job-name", JOB, env=env)
    assert gone.returncode == 2 and "No running job named" in gone.stderr
    tags = set(read_scalars(tmp_path / "out" / "tensorboard"))
    assert {"train/loss", "train/examples_per_second", "train/tasks_waiting",
            "train/tasks_running", "train/workers", "worker/0/examples_per_second",
            "staleness/ps-0", "eval/accuracy"} <= tags, tags
