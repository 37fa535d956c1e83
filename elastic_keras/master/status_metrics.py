"""`/metrics`: the job's status in the Prometheus text format (version 0.0.4).

Every sample carries `job="<job name>"`. Gauges: examples per second, training loss, model
version (job and per shard), epoch, records of the epoch (or round) done, tasks waiting (the
queue's depth, of any type) and running, workers alive, the last evaluation's metrics, per
shard its table rows and resident memory, seconds since each role's last heartbeat.
Counters: relaunches per role, pushes
applied per shard and staleness, pushes rejected as stale per shard, bytes each shard
received and sent (its messages as serialized for the wire, across its relaunches).
"""

import math

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(snapshot):
    """The Prometheus text of a `StatusView.snapshot()`."""
    job = {"job": snapshot["job"]["name"]}
    progress = snapshot["progress"]
    out = _Metrics()
    out.gauge("examples_per_second", "Training examples per second (10 s window).",
              [(job, progress.get("examples_per_second"))])
    out.gauge("loss", "Smoothed training loss.", [(job, progress.get("loss"))])
    out.gauge("model_version", "Highest model version reached.",
              [(job, progress.get("model_version"))])
    out.gauge("epoch", "Epoch in progress (1-based).", [(job, progress.get("epoch"))])
    out.gauge("tasks_waiting", "Tasks waiting to be handed out (the queue's depth).",
              [(job, progress.get("tasks_waiting"))])
    out.gauge("tasks_running", "Tasks held by workers.", [(job, progress.get("tasks_running"))])
    out.gauge("workers_alive", "Workers running and not leaving.",
              [(job, progress.get("workers_alive"))])
    out.gauge("records_done", "Records of the current epoch (or round) done.",
                [(job, progress.get("records_done"))])
    out.counter("relaunches", "Relaunches of a role.",
                [({**job, "role": role}, n)
                 for role, n in sorted(snapshot["relaunches"].items())])
    last = snapshot["evaluations"][-1:]
    out.gauge("evaluation_metric", "The last evaluation's metrics.",
              [({**job, "metric": name}, value) for e in last
               for name, value in sorted(e["metrics"].items())])
    shards = snapshot["ps"]
    out.gauge("ps_model_version", "Model version of a parameter-server shard.",
              [({**job, "ps": str(s["id"])}, s["version"]) for s in shards])
    out.gauge("ps_table_rows", "Embedding rows a shard holds.",
              [({**job, "ps": str(s["id"]), "table": t}, n) for s in shards
               for t, n in sorted(s["table_rows"].items())])
    tables = [(name, shard, counts) for name, per in snapshot["tables"].items()
              for shard, counts in per.items() if shard != "total"]
    for key, what in (("admitted", "Embedding rows a shard created."),
                      ("evicted", "Embedding rows a shard evicted."),
                      ("not_admitted_lookups", "Training lookups a shard gave no row."),
                      ("dropped_gradients", "Gradient rows of ids without a row, dropped.")):
        out.counter(f"ps_table_{key}", what,
                    [({**job, "ps": shard.removeprefix("ps-"), "table": name}, counts[key])
                     for name, shard, counts in tables])
    out.gauge("ps_memory_bytes", "Resident memory of a shard's process.",
              [({**job, "ps": str(s["id"])}, s["memory_bytes"]) for s in shards])
    out.counter("ps_bytes_received", "Bytes of the messages a shard received (pushes, ...).",
                [({**job, "ps": str(s["id"])}, s["bytes_received"]) for s in shards])
    out.counter("ps_bytes_sent", "Bytes of the messages a shard sent (pulls, ...).",
                [({**job, "ps": str(s["id"])}, s["bytes_sent"]) for s in shards])
    out.gauge("heartbeat_age_seconds", "Seconds since a role's last heartbeat.",
              [({**job, "role": f"ps-{s['id']}"}, s["heard_s_ago"]) for s in shards]
              + [({**job, "role": f"worker-{w['id']}"}, w["heard_s_ago"])
                 for w in snapshot["workers"]])
    staleness = snapshot["staleness"]
    out.counter("pushes_rejected_stale", "Pushes a shard rejected as too stale.",
                [({**job, "ps": name.removeprefix("ps-")}, s["rejected_as_stale"])
                 for name, s in sorted(staleness.items())])
    out.counter("pushes_applied", "Pushes a shard applied, by staleness (async training).",
                [({**job, "ps": name.removeprefix("ps-"), "staleness": str(k)}, n)
                 for name, s in sorted(staleness.items())
                 for k, n in enumerate(s["applied_by_staleness"])])
    return out.text()


class _Metrics:
    def __init__(self):
        self._lines = []

    def gauge(self, name, help_, samples):
        self._family(name, "gauge", help_, samples)

    def counter(self, name, help_, samples):
        self._family(name + "_total", "counter", help_, samples)

    def _family(self, name, kind, help_, samples):
        samples = [(labels, value) for labels, value in samples
                   if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and math.isfinite(value)]
        if not samples:
            return
        name = f"elastic_keras_{name}"  # the 0.0.4 format: HELP and TYPE name the samples
        self._lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self._lines.append(f"{name}{{{text}}} {value}")

    def text(self):
        return "\n".join(self._lines) + "\n"


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
