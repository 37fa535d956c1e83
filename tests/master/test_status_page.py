"""The status page's pieces without a job: `/metrics` as Prometheus parses it, the text of
`elastic-keras status`, and the HTTP server on 127.0.0.1 (a real socket)."""

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from elastic_keras.master import status_metrics
from elastic_keras.master.status_server import StatusServer
from elastic_keras.master.status_text import format_status

SNAPSHOT = {
    "job": {"name": 'demo "job"', "type": "train", "engine": "local", "state": "running",
            "started": 0.0, "elapsed_s": 42.0, "master": "127.0.0.1:1"},
    "progress": {"model_version": 120, "examples_per_second": 850.5, "loss": 0.25,
                 "workers_alive": 2, "relaunches": 1, "stopped_early": None,
                 "tasks_waiting": 7, "tasks_running": 2, "epoch": 2, "num_epochs": 3,
                 "records_done": 1000, "records_total": 4000},
    "series": [{"t": 1.0, "examples_per_second": 800.0, "loss": 0.3, "version": 100,
                "workers": 2}],
    "evaluations": [{"epoch": 1, "model_version": 60, "end_of_epoch": True,
                     "metrics": {"accuracy": 0.75}}],
    "workers": [{"id": 0, "state": "running", "host": "127.0.0.1", "launch": 1,
                 "heard_s_ago": 0.4, "examples_per_second": 400.0,
                 "task": {"id": 9, "type": "training", "file": "/d/train-0.tfrecord",
                          "start": 0, "end": 512, "records_done": 128}},
                {"id": 1, "state": "exited", "host": "", "launch": 0, "heard_s_ago": None,
                 "examples_per_second": 0.0, "task": None}],
    "ps": [{"id": 0, "address": "127.0.0.1:2", "heard_s_ago": 0.1, "version": 120,
            "table_rows": {"embedding": 300}, "memory_bytes": 300 * 2**20,
            "bytes_received": 5000, "bytes_sent": 7000, "state": "running"}],
    "events": [{"time": 0.0, "role": "worker-0", "what": "was killed (SIGKILL)",
                "relaunches": 1}],
    "relaunches": {"worker-0": 1},
    "staleness": {"ps-0": {"applied_by_staleness": [50, 20, 3], "rejected_as_stale": 4}},
    "tables": {"embedding": {
        "ps-0": {"rows": 300, "bytes": 3 * 2**20, "admitted": 900, "evicted": 600,
                 "not_admitted_lookups": 4100, "dropped_gradients": 77},
        "total": {"rows": 300, "bytes": 3 * 2**20, "admitted": 900, "evicted": 600,
                  "not_admitted_lookups": 4100, "dropped_gradients": 77}}},
}


def _families():
    text = status_metrics.render(SNAPSHOT)
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_as_prometheus_text_with_the_jobs_label():
    families = _families()
    expected = {"elastic_keras_examples_per_second": 850.5, "elastic_keras_loss": 0.25,
                "elastic_keras_tasks_waiting": 7, "elastic_keras_workers_alive": 2,
                "elastic_keras_model_version": 120, "elastic_keras_records_done": 1000}
    for name, value in expected.items():
        (sample,) = families[name].samples
        assert sample.value == value and sample.labels == {"job": 'demo "job"'}
    assert families["elastic_keras_records_done"].type == "gauge"  # it restarts each epoch
    assert families["elastic_keras_relaunches"].type == "counter"
    rows = {s.labels["table"]: s.value for s in families["elastic_keras_ps_table_rows"].samples}
    assert rows == {"embedding": 300}
    applied = {s.labels["staleness"]: s.value
               for s in families["elastic_keras_pushes_applied"].samples}
    assert applied == {"0": 50, "1": 20, "2": 3}
    evicted = families["elastic_keras_ps_table_evicted"]
    assert evicted.type == "counter"
    assert [(x.labels["ps"], x.labels["table"], x.value) for x in evicted.samples] == [
        ("0", "embedding", 600)]
    dropped = families["elastic_keras_ps_table_dropped_gradients"].samples
    assert [x.value for x in dropped] == [77]
    sent = families["elastic_keras_ps_bytes_sent"]
    assert sent.type == "counter" and sent.samples[0].value == 7000
    ages = {s.labels["role"] for s in families["elastic_keras_heartbeat_age_seconds"].samples}
    assert ages == {"ps-0", "worker-0"}  # worker-1 has no heartbeat: no sample


def test_the_terminal_view_names_workers_shards_and_failures():
    text = format_status(SNAPSHOT)
    assert "epoch 2/3, records 1000/4000, version 120, 850 examples/s, loss 0.2500" in text
    assert "training train-0.tfrecord [0, 512) 128/512" in text
    assert "300 MiB" in text and "accuracy 0.7500" in text
    assert "worker-0 was killed (SIGKILL) (relaunched 1x)" in text
    table_line = next(line for line in text.splitlines() if line.strip().startswith("embedding"))
    assert table_line.split() == ["embedding", "300", "3.0", "MiB", "900", "600", "4100", "77"]


class _View:
    def __init__(self, fail=False):
        self.fail = fail

    def snapshot(self):
        if self.fail:
            raise RuntimeError("membership gone")
        return SNAPSHOT


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.headers["Content-Type"], answer.read().decode()


@pytest.fixture
def server():
    page = StatusServer(_View())
    yield page
    page.close()


def test_the_server_answers_on_loopback_with_the_page_json_and_metrics(server):
    assert server.url.startswith("http://127.0.0.1:")
    status, kind, body = _get(server.url)
    assert status == 200 and kind.startswith("text/html") and 'id="workers"' in body
    assert "http://" not in body.replace("http://127.0.0.1", "")  # nothing from elsewhere
    assert json.loads(_get(server.url + "status.json")[2]) == SNAPSHOT
    status, kind, body = _get(server.url + "metrics")
    assert kind == status_metrics.CONTENT_TYPE and "elastic_keras_loss" in body
    with pytest.raises(urllib.error.HTTPError) as missing:
        _get(server.url + "admin")
    assert missing.value.code == 404


@pytest.mark.parametrize("host, code", [
    ("127.0.0.1:{port}", 200), ("localhost:{port}", 200), ("LOCALHOST", 200), ("[::1]:80", 200),
    ("evil.example:{port}", 403), ("127.0.0.1.evil.example", 403), ("", 403),
    ("[::1].evil.example", 403), ("localhost:80x", 403), ("localhost@evil.example", 403),
])
def test_only_requests_for_the_loopback_are_answered(server, host, code):
    port = server.url.rsplit(":", 1)[1].strip("/")
    request = urllib.request.Request(server.url + "status.json",
                                     headers={"Host": host.format(port=port)})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            got = answer.status
    except urllib.error.HTTPError as refused:
        got = refused.code
        assert b"127.0.0.1, localhost or [::1] only" in refused.read()
    assert got == code


def test_a_failing_view_answers_500_and_the_server_lives_on():
    page = StatusServer(_View(fail=True))
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            _get(page.url + "status.json")
        assert failed.value.code == 500 and b"membership gone" in failed.value.read()
        assert _get(page.url)[0] == 200
    finally:
        page.close()
