"""Who is in the job: parameter-server addresses, registered workers, heartbeats, versions."""

import threading
import time


class Membership:
    """What the master knows of its roles; thread-safe."""

    def __init__(self, num_ps):
        self.num_ps = num_ps
        self._lock = threading.Lock()
        self._ps = {}
        self._ps_versions = {}
        self._ps_staleness = {}   # ps id -> (counts by staleness, rejections)
        self._ps_pending = {}
        self._ps_reported = {}
        self._ps_applied = {}     # ps id -> {worker id: pushes applied}
        self._workers = set()
        self._last_seen = {}
        self._ps_non_finite = {}  # ps id -> NaN/Inf pushes its current run refused or skipped
        self._ps_load = {}   # ps id -> (table rows, resident memory bytes), as last reported
        self._hosts = {}     # worker id -> the host it called from
        self._wire = _WireTotals()
        self._non_finite_before = 0  # those counted by shards' earlier runs

    def register_ps(self, ps_id, address):
        with self._lock:
            self._ps[ps_id] = address
            self._last_seen[("ps", ps_id)] = time.monotonic()

    def forget_ps(self, ps_id):
        with self._lock:
            self._ps.pop(ps_id, None)

    def ps_addresses(self):
        """(ready, addresses): ready once every shard has registered."""
        with self._lock:
            if len(self._ps) < self.num_ps:
                return False, []
            return True, [self._ps[i] for i in range(self.num_ps)]

    def register_worker(self, worker_id, host=""):
        with self._lock:
            self._workers.add(worker_id)
            self._hosts[worker_id] = host
            self._last_seen[("worker", worker_id)] = time.monotonic()

    def forget_worker(self, worker_id):
        """The worker has exited: a relaunched one must register afresh."""
        with self._lock:
            self._workers.discard(worker_id)
            self._last_seen.pop(("worker", worker_id), None)

    def silent(self, role, timeout_s):
        """Ids of the registered roles of type `role` ("ps" or "worker") not heard from for
        more than `timeout_s` seconds, leaving out shards marked down since they last
        registered."""
        now = time.monotonic()
        with self._lock:
            registered = self._ps if role == "ps" else self._workers
            return sorted(i for i in registered
                          if now - self._last_seen.get((role, i), now) > timeout_s)

    def shards_answering(self, within_s):
        """Whether every shard has registered and been heard from in the last `within_s`
        seconds (a shard marked down: once its replacement registers)."""
        now = time.monotonic()
        with self._lock:
            return len(self._ps) == self.num_ps and all(
                now - self._last_seen.get(("ps", i), -float("inf")) <= within_s
                for i in range(self.num_ps))

    def mark_ps_down(self, ps_id):
        """The shard's process is gone or being replaced: its replacement is not judged
        silent before it registers (after restoring its checkpoint, however long that
        takes)."""
        with self._lock:
            self._last_seen.pop(("ps", ps_id), None)

    def ps_exited(self, ps_id):
        """The shard's process has exited: `mark_ps_down`, and the bytes and NaN/Inf pushes
        it reported stay counted while its replacement counts from 0."""
        self.mark_ps_down(ps_id)
        with self._lock:
            self._wire.ended(ps_id)
            self._non_finite_before += self._ps_non_finite.pop(ps_id, 0)

    def heartbeat(self, role, role_id):
        """Records a heartbeat; returns whether the role has registered with this master."""
        with self._lock:
            self._last_seen[(role, role_id)] = time.monotonic()
            if role == "ps":
                return role_id in self._ps
            return role_id in self._workers

    def report_version(self, ps_id, version, staleness_counts=(), stale_rejections=0,
                       pending_pushes=0, applied_pushes=None, non_finite_pushes=0,
                       table_stats=None, memory_bytes=0, wire_bytes=(0, 0)):
        """Records a shard's report; `table_stats` maps each table to its
        `TableLifecycleStats` fields (rows, bytes, admitted, evicted, ...)."""
        with self._lock:
            self._ps_load[ps_id] = ({name: dict(stats) for name, stats in
                                     (table_stats or {}).items()}, memory_bytes)
            self._wire.report(ps_id, wire_bytes)
            self._ps_non_finite[ps_id] = non_finite_pushes
            self._ps_applied[ps_id] = dict(applied_pushes or {})
            self._ps_versions[ps_id] = max(version, self._ps_versions.get(ps_id, 0))
            self._ps_staleness[ps_id] = (list(staleness_counts), stale_rejections)
            self._ps_pending[ps_id] = pending_pushes
            self._ps_reported[ps_id] = time.monotonic()

    def view(self):
        """What the status page shows of the roles: per worker and per shard, the seconds
        since it was last heard from (None: not registered), and the workers' hosts, the
        shards' addresses, versions, table rows and memory."""
        now = time.monotonic()
        with self._lock:
            def ago(role, i):
                seen = self._last_seen.get((role, i))
                return None if seen is None else round(now - seen, 1)

            workers = {i: {"registered": i in self._workers, "host": self._hosts.get(i, ""),
                           "heard_s_ago": ago("worker", i)} for i in self._hosts}
            shards = {i: {"address": self._ps.get(i, ""), "heard_s_ago": ago("ps", i),
                          "version": self._ps_versions.get(i, 0),
                          "table_rows": {t: stats["rows"] for t, stats in
                                         self._ps_load.get(i, ({}, 0))[0].items()},
                          "memory_bytes": self._ps_load.get(i, ({}, 0))[1],
                          **self._wire.of(i)}
                      for i in range(self.num_ps)}
            return workers, shards

    @property
    def non_finite_pushes(self):
        """Pushes holding NaN or Inf the shards refused or skipped, in the whole job."""
        with self._lock:
            return self._non_finite_before + sum(self._ps_non_finite.values())

    def staleness(self):
        """Per shard: `{"applied_by_staleness": [...], "rejected_as_stale": n}`."""
        with self._lock:
            return {
                f"ps-{ps_id}": {"applied_by_staleness": counts, "rejected_as_stale": rejected}
                for ps_id, (counts, rejected) in sorted(self._ps_staleness.items())
            }

    def tables(self):
        """Per table, per shard (`"ps-N"`) and in total over the shards: what the shards
        last reported of its rows, bytes, admissions and evictions."""
        with self._lock:
            loads = sorted((i, stats) for i, (stats, _) in self._ps_load.items())
        tables = {}
        for ps_id, stats in loads:
            for name, counts in stats.items():
                entry = tables.setdefault(name, {"total": dict.fromkeys(counts, 0)})
                entry[f"ps-{ps_id}"] = counts
                for key, value in counts.items():
                    entry["total"][key] = entry["total"].get(key, 0) + value
        return dict(sorted(tables.items()))

    def mean_staleness(self):
        """`{"staleness/ps-N": mean staleness of the pushes shard N applied}` (asynchronous
        training; the last count of a shard's histogram counts that staleness and more)."""
        with self._lock:
            return {f"staleness/ps-{ps_id}": sum(k * n for k, n in enumerate(counts)) / total
                    for ps_id, (counts, _) in sorted(self._ps_staleness.items())
                    if (total := sum(counts))}

    def applied_pushes(self):
        """Per shard, `{worker id: pushes whose updates it holds}` (ids as text), as it last
        reported."""
        with self._lock:
            return {f"ps-{ps_id}": {str(w): n for w, n in sorted(applied.items())}
                    for ps_id, applied in sorted(self._ps_applied.items())}

    def rounds_closed_since(self, since):
        """Whether every shard has reported, after monotonic time `since`, no open round."""
        with self._lock:
            return all(
                self._ps_reported.get(i, 0) > since and not self._ps_pending.get(i)
                for i in range(self.num_ps)
            )

    def wait_for_rounds_closed(self, timeout_s, tick_s=0.2):
        """Waits until every shard has reported, after this call, no open synchronous round
        (its version and applied pushes are then final); returns whether it happened."""
        since = time.monotonic()
        while not self.rounds_closed_since(since):
            if time.monotonic() > since + timeout_s:
                return False
            time.sleep(tick_s)
        return True

    def ps_version(self, ps_id):
        """The highest version shard `ps_id` reported (0: none)."""
        with self._lock:
            return self._ps_versions.get(ps_id, 0)

    @property
    def model_version(self):
        """The highest version any shard reported."""
        with self._lock:
            return max(self._ps_versions.values(), default=0)


class _WireTotals:
    """Bytes each shard received and sent over the job, across its relaunches (a relaunched
    shard counts from 0 again). Not locked: `Membership` calls it under its lock."""

    def __init__(self):
        self._last = {}    # ps id -> (received, sent) of its current run
        self._before = {}  # ps id -> (received, sent) of its earlier runs

    def report(self, ps_id, counts):
        self._last[ps_id] = tuple(counts)

    def ended(self, ps_id):
        """The shard's run has ended: what it reported joins its earlier runs'."""
        last, before = self._last.pop(ps_id, (0, 0)), self._before.get(ps_id, (0, 0))
        self._before[ps_id] = (before[0] + last[0], before[1] + last[1])

    def of(self, ps_id):
        last, before = self._last.get(ps_id, (0, 0)), self._before.get(ps_id, (0, 0))
        return {"bytes_received": last[0] + before[0], "bytes_sent": last[1] + before[1]}
