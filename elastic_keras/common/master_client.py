"""The client side of the master's service, used by workers and parameter servers."""

from elastic_keras.common import rpc
from elastic_keras.proto import master_pb2, master_pb2_grpc

# Parameter servers and workers heartbeat this often, and exit once the master has not
# answered for MASTER_LOST_S, so that no role outlives its job as an orphan.
HEARTBEAT_INTERVAL_S = 2.0
MASTER_LOST_S = 30.0
SOONEST_HEARTBEAT_S = 0.2  # the shortest wait a master may ask of a shard


def ending_heartbeat_s(num_ps):
    """How often shards heartbeat while a job's last tasks run (`next_heartbeat_s`): their
    final reports then reach the master within a fraction of a second, and the master hears
    from all of them together about 10 times a second at most."""
    return _paced(num_ps / 10)


def next_heartbeat_s(answer):
    """The wait before a shard's next heartbeat that a `HeartbeatResponse` asks for, kept
    within [SOONEST_HEARTBEAT_S, HEARTBEAT_INTERVAL_S] (0 or none: the usual interval)."""
    asked = answer.next_heartbeat_s
    if not asked > 0:  # 0, negative or NaN
        return HEARTBEAT_INTERVAL_S
    return _paced(asked)


def _paced(seconds):
    """`seconds` kept within [SOONEST_HEARTBEAT_S, HEARTBEAT_INTERVAL_S]."""
    return min(HEARTBEAT_INTERVAL_S, max(SOONEST_HEARTBEAT_S, seconds))

# Calls the master may see twice without harm: registration is by id, progress is absolute,
# a result for a task that is no longer running is ignored.
_IDEMPOTENT = (
    "RegisterPS", "RegisterWorker", "GetCluster", "Heartbeat", "ReportProgress",
    "ReportTaskResult", "ReportVersion",
)


class MasterClient:
    """Calls the master at `address` ("host:port"); every call has a deadline and carries
    credential `token` (see `auth`) when given, over TLS with `tls` when given."""

    def __init__(self, address, deadline_s=rpc.DEFAULT_DEADLINE_S, token=None, tls=None):
        self.address = address
        self._channel = rpc.create_channel(
            address, "elastic_keras.Master", _IDEMPOTENT, deadline_s, token, tls
        )
        self._stub = master_pb2_grpc.MasterStub(self._channel)

    def register_ps(self, ps_id, address):
        self._stub.RegisterPS(master_pb2.RegisterPSRequest(ps_id=ps_id, address=address))

    def register_worker(self, worker_id):
        self._stub.RegisterWorker(master_pb2.RegisterWorkerRequest(worker_id=worker_id))

    def get_cluster(self, worker_id):
        """Returns (ready, ps_addresses)."""
        response = self._stub.GetCluster(master_pb2.GetClusterRequest(worker_id=worker_id))
        return response.ready, list(response.ps_addresses)

    def heartbeat(self, role, role_id, timeout_s=None, round_size=0):
        """The master's `HeartbeatResponse`: `job_finished` tells the caller to exit; a
        synchronous shard sends its `round_size` and gets a new one when it changed."""
        return self._stub.Heartbeat(
            master_pb2.HeartbeatRequest(role=role, id=role_id, round_size=round_size),
            timeout=timeout_s,
        )

    def get_task(self, worker_id, landing_task_id=0):
        """The next task; `landing_task_id` names a task of this worker's whose last push is
        still landing (the master keeps it; any other task the worker holds is taken back)."""
        return self._stub.GetTask(master_pb2.GetTaskRequest(
            worker_id=worker_id, landing_task_id=landing_task_id)).task

    def report_progress(self, worker_id, task_id, records_done, loss, model_version,
                        minibatches=0, skipped=None):
        """`records_done`, `minibatches` and `skipped` (minibatches not pushed, by reason)
        count from the task's start (a retried report changes nothing)."""
        self._stub.ReportProgress(
            master_pb2.ReportProgressRequest(
                worker_id=worker_id, task_id=task_id, records_done=records_done,
                loss=loss, model_version=model_version, minibatches=minibatches,
                skipped_minibatches=skipped or {},
            )
        )

    def report_task_result(self, worker_id, task_id, records_done, error="", loss=0.0,
                           model_version=0, metric_states=(), abandoned=False, timeout_s=None,
                           minibatches=0, dropped=None, fatal="", skipped=None,
                           predictions=()):
        """Ends a task; `abandoned` hands it back (the worker is leaving) after
        `records_done` records, without counting a failure. `minibatches` counts the
        attempt's settled minibatches, `dropped` maps shards that never applied one of them
        to why, `skipped` counts minibatches not pushed by reason. `fatal` (with `error`)
        says why no retry can help: the job fails at once. `predictions`: a prediction
        task's outputs (`Tensor` messages)."""
        self._stub.ReportTaskResult(
            master_pb2.ReportTaskResultRequest(
                worker_id=worker_id, task_id=task_id, error=error, records_done=records_done,
                loss=loss, model_version=model_version, metric_states=list(metric_states),
                abandoned=abandoned, minibatches=minibatches,
                dropped=[master_pb2.DroppedPushes(ps_id=ps_id, reason=reason, count=1)
                         for ps_id, reason in (dropped or {}).items()],
                fatal=fatal, skipped_minibatches=skipped or {},
                predictions=list(predictions),
            ),
            timeout=timeout_s,
        )

    def scale(self, job_name, num_workers):
        """Asks the master of `job_name` to run `num_workers` workers from now on."""
        return self._stub.Scale(
            master_pb2.ScaleRequest(job_name=job_name, num_workers=num_workers)
        )

    def report_version(self, ps_id, model_version, staleness_counts=(), stale_rejections=0,
                       pending_pushes=0, applied_pushes=None, non_finite_pushes=0,
                       table_stats=None, memory_bytes=0, wire_bytes=(0, 0)):
        """Tells the master a shard's version and load; `table_stats` maps each table to
        the fields of a `TableLifecycleStats` (its rows, bytes, admissions, evictions, ...)."""
        table_stats = table_stats or {}
        self._stub.ReportVersion(
            master_pb2.ReportVersionRequest(
                ps_id=ps_id, model_version=model_version,
                staleness_counts=list(staleness_counts), stale_rejections=stale_rejections,
                pending_pushes=pending_pushes, applied_pushes=applied_pushes or {},
                non_finite_pushes=non_finite_pushes,
                table_stats={name: master_pb2.TableLifecycleStats(**stats)
                             for name, stats in table_stats.items()},
                memory_bytes=memory_bytes, bytes_received=wire_bytes[0],
                bytes_sent=wire_bytes[1],
            )
        )

    def close(self):
        self._channel.close()
