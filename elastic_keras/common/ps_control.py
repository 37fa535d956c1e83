"""The master's control calls to the parameter-server shards: the two steps of a
checkpoint and the learning rate. `PSClient` has them; the shards are its `_stubs`.
"""

import grpc

from elastic_keras.proto import pserver_pb2


class ShardControl:
    """Checkpoint and learning-rate calls to every shard (a mixin of `PSClient`, whose
    `_stubs` and `num_ps` they use)."""

    def prepare_checkpoint(self, checkpoint_id, hold_s, timeout_s=None):
        """Has every shard hold pushes back for checkpoint `checkpoint_id` (see
        `pserver.proto`); returns the cut: per worker, the highest sequence any shard
        applied."""
        request = pserver_pb2.PrepareCheckpointRequest(checkpoint_id=checkpoint_id,
                                                       hold_s=hold_s)
        calls = [stub.PrepareCheckpoint.future(request, timeout=timeout_s)
                 for stub in self._stubs]
        cut = {}
        for call in calls:
            for worker, sequence in call.result().applied_sequences.items():
                cut[worker] = max(sequence, cut.get(worker, sequence))
        return cut

    def release_checkpoint(self, checkpoint_id, timeout_s=None):
        """Ends every shard's hold of checkpoint `checkpoint_id`; shards that cannot be
        reached end it when it runs out."""
        request = pserver_pb2.ReleaseCheckpointRequest(checkpoint_id=checkpoint_id)
        calls = [stub.ReleaseCheckpoint.future(request, timeout=timeout_s)
                 for stub in self._stubs]
        for call in calls:
            try:
                call.result()
            except grpc.RpcError:
                pass

    def learning_rate(self, rate=None, timeout_s=None):
        """Sets every shard's learning rate to `rate` (None: only reads); returns each
        shard's `LearningRateResponse`, in shard order.

        Raises:
            grpc.RpcError: a shard refused (INVALID_ARGUMENT: a bad rate, or a schedule) or
                did not answer.
        """
        request = pserver_pb2.LearningRateRequest(
            **({} if rate is None else {"learning_rate": float(rate)}))
        calls = [stub.LearningRate.future(request, timeout=timeout_s) for stub in self._stubs]
        return [call.result() for call in calls]

    def save_checkpoint(self, checkpoint_id, timeout_s=None, cut=None, without_cut=False):
        """Asks every shard to save its state into checkpoint `checkpoint_id`: the directory
        `CHECKPOINT_DIR/ckpt-N` of the shard's own `--checkpoint-dir`.

        Args:
            checkpoint_id: the checkpoint's number N (1 or more).
            timeout_s: the deadline of each call (default: the client's).
            cut: the cut `prepare_checkpoint(checkpoint_id, ...)` returned (or a part of it).
            without_cut: each shard saves as it is now, with no `prepare_checkpoint` before.

        Returns:
            The shards' `SaveCheckpointResponse`s (file, bytes, crc32c, model_version), in
            shard order, for the manifest.

        Raises:
            grpc.RpcError: a shard could not save (INVALID_ARGUMENT: a bad request;
                FAILED_PRECONDITION: not initialised, or no checkpoint directory; INTERNAL:
                the write failed).
        """
        request = pserver_pb2.SaveCheckpointRequest(num_ps=self.num_ps,
                                                    checkpoint_id=checkpoint_id, cut=cut or {},
                                                    without_cut=without_cut)
        calls = [stub.SaveCheckpoint.future(request, timeout=timeout_s) for stub in self._stubs]
        return [call.result() for call in calls]
