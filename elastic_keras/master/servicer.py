"""The master's gRPC servicer: translates between protobuf and the `Master` object.

Every call has passed `auth.ServerAuth` (a valid credential of a role the method is for,
see `AUTHORITY`); here each request is bound to its caller: a shard registers and reports
only as itself, a worker only as itself and only in its current launch. Then its values
are checked (counts not negative, ids in range, lists bounded): a bad one is
INVALID_ARGUMENT naming the field and what was received, and changes nothing. A worker
holds one task at a time: asking for another hands back the one it holds (see
`Reports.get_task`).
"""

import grpc

from elastic_keras.common import auth
from elastic_keras.common.master_client import ending_heartbeat_s
from elastic_keras.master.tasks import TaskType
from elastic_keras.proto import master_pb2, master_pb2_grpc

_WIRE_TYPES = {TaskType.TRAINING: master_pb2.TASK_TRAINING,
               TaskType.EVALUATION: master_pb2.TASK_EVALUATION,
               TaskType.PREDICTION: master_pb2.TASK_PREDICTION}

_PS, _WORKER = auth.Role.PS, auth.Role.WORKER
AUTHORITY = {
    "RegisterPS": {_PS}, "ReportVersion": {_PS}, "Heartbeat": {_PS, _WORKER},
    "RegisterWorker": {_WORKER}, "GetCluster": {_WORKER}, "GetTask": {_WORKER},
    "ReportProgress": {_WORKER}, "ReportTaskResult": {_WORKER},
    "Scale": {auth.Role.CLIENT},
}
# The longest list a shard's report may carry (staleness buckets, workers' push counts).
MAX_REPORT_ENTRIES = 65536
_TABLE_STATS = tuple(f.name for f in master_pb2.TableLifecycleStats.DESCRIPTOR.fields)


def _require(context, ok, method, rule, received):
    """Aborts the call with INVALID_ARGUMENT unless `ok`: "`method`: `rule`. Received: ..."."""
    if not ok:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {rule}. Received: {received}")


def _check_counts(context, method, request, *fields):
    for field in fields:
        value = getattr(request, field)
        _require(context, value >= 0, method, f"{field} must not be negative", f"{field}={value}")


class MasterServicer(master_pb2_grpc.MasterServicer):
    def __init__(self, master):
        self._master = master

    def _bind(self, context, role, index):
        """Aborts with PERMISSION_DENIED unless the caller is `role` number `index`, and,
        for a worker, its current launch (a server without `ServerAuth` binds nothing)."""
        caller = auth.caller(context)
        if caller is None:
            return
        if caller.role.value != role or caller.index != index:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"{caller.name} may not act as {role}-{index}")
        if caller.role == _WORKER and not self._master.is_current(caller):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"{caller.name} launch {caller.incarnation} has been replaced")

    def RegisterPS(self, request, context):
        self._bind(context, "ps", request.ps_id)
        self._check_ps_id(context, "RegisterPS", request.ps_id)
        host, _, port = request.address.rpartition(":")
        _require(context, bool(host) and port.isdigit() and 0 < int(port) < 65536, "RegisterPS",
                 "address must be host:port", f"address={request.address[:200]!r}")
        self._master.membership.register_ps(request.ps_id, request.address)
        return master_pb2.RegisterPSResponse()

    def RegisterWorker(self, request, context):
        self._bind(context, "worker", request.worker_id)
        self._master.membership.register_worker(request.worker_id, _peer_host(context))
        return master_pb2.RegisterWorkerResponse()

    def GetCluster(self, request, context):
        self._bind(context, "worker", request.worker_id)
        ready, addresses = self._master.membership.ps_addresses()
        return master_pb2.GetClusterResponse(ready=ready, ps_addresses=addresses)

    def Heartbeat(self, request, context):
        _require(context, request.role in ("ps", "worker"), "Heartbeat",
                 "role must be 'ps' or 'worker'", f"role={request.role[:50]!r}")
        self._bind(context, request.role, request.id)
        known = self._master.membership.heartbeat(request.role, request.id)
        answer = master_pb2.HeartbeatResponse(job_finished=self._master.job_finished,
                                              register_again=not known)
        if request.role == "worker":
            answer.ps_addresses.extend(self._master.membership.ps_addresses()[1])
        if request.role == "ps" and self._master.reports.training_ends:
            answer.next_heartbeat_s = ending_heartbeat_s(self._master.membership.num_ps)
        if request.role == "ps" and self._master.config.grads_to_wait:
            size = self._master.sync_round_size
            if size != request.round_size:  # sent once per change
                answer.sync_round_size = size
        return answer

    def GetTask(self, request, context):
        self._bind(context, "worker", request.worker_id)
        task = self._master.reports.get_task(request.worker_id, request.landing_task_id)
        if task is None:
            done = self._master.reports.no_more_tasks
            kind = master_pb2.TASK_NONE if done else master_pb2.TASK_WAIT
            return master_pb2.GetTaskResponse(task=master_pb2.Task(type=kind))
        return master_pb2.GetTaskResponse(
            task=master_pb2.Task(
                task_id=task.task_id, type=_WIRE_TYPES[task.type], path=task.path,
                start=task.start, end=task.end, epoch=task.epoch,
                model_version=task.model_version,
            )
        )

    def ReportProgress(self, request, context):
        self._bind(context, "worker", request.worker_id)
        self._check_report(context, "ReportProgress", request)
        self._master.reports.report_progress(
            request.worker_id, request.task_id, request.records_done, request.loss,
            request.model_version, request.minibatches, dict(request.skipped_minibatches),
        )
        return master_pb2.ReportProgressResponse()

    def ReportTaskResult(self, request, context):
        self._bind(context, "worker", request.worker_id)
        self._check_report(context, "ReportTaskResult", request)
        for dropped in request.dropped:
            self._check_ps_id(context, "ReportTaskResult dropped", dropped.ps_id)
        self._master.reports.report_task_result(
            request.worker_id, request.task_id, request.records_done, request.error,
            request.loss, request.model_version, request.metric_states, request.abandoned,
            request.minibatches, {d.ps_id: d.reason for d in request.dropped},
            request.fatal, dict(request.skipped_minibatches), request.predictions,
        )
        return master_pb2.ReportTaskResultResponse()

    def ReportVersion(self, request, context):
        self._bind(context, "ps", request.ps_id)
        self._check_version_report(context, request)
        self._master.membership.report_version(
            request.ps_id, request.model_version, list(request.staleness_counts),
            request.stale_rejections, request.pending_pushes, dict(request.applied_pushes),
            request.non_finite_pushes,
            {name: {key: getattr(stats, key) for key in _TABLE_STATS}
             for name, stats in request.table_stats.items()}, request.memory_bytes,
            (request.bytes_received, request.bytes_sent),
        )
        return master_pb2.ReportVersionResponse()

    def Scale(self, request, context):
        job_name = self._master.config.job_name
        if request.job_name and request.job_name != job_name:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"This master runs job {job_name!r}. Received: job_name="
                          f"{request.job_name!r}")
        most = self._master.config.max_workers
        _require(context, 1 <= request.num_workers <= most, "Scale",
                 f"num_workers must be from 1 to --max-workers {most}",
                 f"num_workers={request.num_workers}")
        if self._master.roles is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "The job has not started its roles yet.")
        previous, running = self._master.scale(request.num_workers)
        return master_pb2.ScaleResponse(
            job_name=job_name, previous_num_workers=previous,
            num_workers=request.num_workers, running_workers=running,
        )

    def _check_ps_id(self, context, method, ps_id):
        num_ps = self._master.membership.num_ps
        _require(context, 0 <= ps_id < num_ps, method, f"ps_id must be in [0, {num_ps})",
                 f"ps_id={ps_id}")

    @staticmethod
    def _check_report(context, method, request):
        _check_counts(context, method, request, "task_id", "records_done", "model_version",
                      "minibatches")

    @staticmethod
    def _check_version_report(context, request):
        method = "ReportVersion"
        _check_counts(context, method, request, "model_version", "stale_rejections",
                      "pending_pushes", "non_finite_pushes", "memory_bytes", "bytes_received",
                      "bytes_sent")
        tables = request.table_stats
        _require(context, len(tables) <= MAX_REPORT_ENTRIES and all(
            len(name) <= 256 and min(getattr(s, k) for k in _TABLE_STATS) >= 0
            for name, s in tables.items()), method,
            f"table_stats must map at most {MAX_REPORT_ENTRIES} table names (256 characters at "
            "most) to counts, none negative", f"{len(tables)} entries")
        counts, applied = request.staleness_counts, request.applied_pushes
        _require(context, len(counts) <= MAX_REPORT_ENTRIES and min(counts, default=0) >= 0,
                 method, f"staleness_counts must be at most {MAX_REPORT_ENTRIES} counts, none "
                 "negative", f"{len(counts)} counts from {min(counts, default=0)}")
        _require(context, len(applied) <= MAX_REPORT_ENTRIES
                 and all(w >= 0 and n >= 0 for w, n in applied.items()), method,
                 f"applied_pushes must map at most {MAX_REPORT_ENTRIES} worker ids to counts, "
                 "none negative", f"{len(applied)} entries")


def _peer_host(context):
    """The caller's host as gRPC saw it ("ipv4:10.0.0.5:4321" -> "10.0.0.5")."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]").replace("%5B", "").replace("%5D", "")
    return rest.rsplit(":", 1)[0] if kind == "ipv4" else peer
