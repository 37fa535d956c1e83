"""The master's gRPC servicer: translates between protobuf and the `Master` object.

Every call has passed `auth.ServerAuth` (a valid credential of a role the method is for,
see `AUTHORITY`); here each request is bound to its caller: a shard registers and reports
only as itself, a worker only as itself and only in its current launch.
"""

import grpc

from elastic_keras.common import auth
from elastic_keras.master.tasks import TaskType
from elastic_keras.proto import master_pb2, master_pb2_grpc

_WIRE_TYPES = {TaskType.TRAINING: master_pb2.TASK_TRAINING,
               TaskType.EVALUATION: master_pb2.TASK_EVALUATION}

_PS, _WORKER = auth.Role.PS, auth.Role.WORKER
AUTHORITY = {
    "RegisterPS": {_PS}, "ReportVersion": {_PS}, "Heartbeat": {_PS, _WORKER},
    "RegisterWorker": {_WORKER}, "GetCluster": {_WORKER}, "GetTask": {_WORKER},
    "ReportProgress": {_WORKER}, "ReportTaskResult": {_WORKER},
    "Scale": {auth.Role.CLIENT},
}


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
        self._master.membership.register_ps(request.ps_id, request.address)
        return master_pb2.RegisterPSResponse()

    def RegisterWorker(self, request, context):
        self._bind(context, "worker", request.worker_id)
        self._master.membership.register_worker(request.worker_id)
        return master_pb2.RegisterWorkerResponse()

    def GetCluster(self, request, context):
        self._bind(context, "worker", request.worker_id)
        ready, addresses = self._master.membership.ps_addresses()
        return master_pb2.GetClusterResponse(ready=ready, ps_addresses=addresses)

    def Heartbeat(self, request, context):
        self._bind(context, request.role, request.id)
        known = self._master.membership.heartbeat(request.role, request.id)
        answer = master_pb2.HeartbeatResponse(job_finished=self._master.job_finished,
                                              register_again=not known)
        if request.role == "ps" and self._master.config.grads_to_wait:
            size = self._master.sync_round_size
            if size != request.round_size:  # sent once per change
                answer.sync_round_size = size
        return answer

    def GetTask(self, request, context):
        self._bind(context, "worker", request.worker_id)
        task = self._master.reports.get_task(request.worker_id)
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
        self._master.reports.report_progress(
            request.worker_id, request.task_id, request.records_done, request.loss,
            request.model_version, request.minibatches,
        )
        return master_pb2.ReportProgressResponse()

    def ReportTaskResult(self, request, context):
        self._bind(context, "worker", request.worker_id)
        self._master.reports.report_task_result(
            request.worker_id, request.task_id, request.records_done, request.error,
            request.loss, request.model_version, request.metric_states, request.abandoned,
            request.minibatches, {d.ps_id: d.reason for d in request.dropped},
        )
        return master_pb2.ReportTaskResultResponse()

    def ReportVersion(self, request, context):
        self._bind(context, "ps", request.ps_id)
        self._master.membership.report_version(
            request.ps_id, request.model_version, list(request.staleness_counts),
            request.stale_rejections, request.pending_pushes, dict(request.applied_pushes),
        )
        return master_pb2.ReportVersionResponse()

    def Scale(self, request, context):
        job_name = self._master.config.job_name
        if request.job_name and request.job_name != job_name:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"This master runs job {job_name!r}. Received: job_name="
                          f"{request.job_name!r}")
        if request.num_workers < 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"num_workers must be at least 1. Received: {request.num_workers}")
        if self._master.roles is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "The job has not started its roles yet.")
        previous, running = self._master.scale(request.num_workers)
        return master_pb2.ScaleResponse(
            job_name=job_name, previous_num_workers=previous,
            num_workers=request.num_workers, running_workers=running,
        )
