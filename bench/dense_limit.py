"""The limit of a dense line: what a worker's step costs when nothing but its own work and
its bytes on the wire stand between steps.

`limit` is the same model, records, batch, optimizer and passes as the line it is set
beside, trained in one process by a `tf.function` step (forward, loss, gradients, the
optimizer's update), plus raw gRPC (`bench.raw_grpc`, a server in a process of its own)
moving a step's bytes both ways: the model's trainable parameters as float32 up (the
gradients a worker pushes) and down (the parameters it pulls), once per step, in one unary
call when they fit `DEFAULT_CHUNK_BYTES` (as the fused push-and-pull does) and as a stream of
chunks of that size each way when not. The two are timed one after the other in this
process, and the figure is

    examples / (compute seconds + gRPC seconds)

so a job whose worker overlaps its transfers with its compute, or runs on more cores, can
pass it; on 2 cores it is about the most a worker and its PS can do. Compute is counted from
the first step, tracing included, as the job's figure is.
"""

import json
import time

import numpy as np

from bench.common import ChildServer, peak_rss_mb
from elastic_keras.common.transfer.chunking import DEFAULT_CHUNK_BYTES


def train_loop(spec, dataset, epochs):
    """Trains `spec`'s model on `dataset` for `epochs` passes with a `tf.function` step;
    returns (steps, seconds from the first step to the last, parameter bytes)."""
    model = spec.custom_model()
    steps, started, ends = train_epochs(model, spec.loss, spec.optimizer(), dataset, epochs)
    nbytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    return steps, ends[-1] - started, nbytes


def train_epochs(model, loss_fn, optimizer, dataset, epochs):
    """Trains `model` on `dataset` for `epochs` passes, one `tf.function` step a minibatch
    (the mean of `loss_fn(labels, predictions)` plus the model's own losses, then
    `optimizer.apply_gradients`), with no `fit` around it.

    Returns:
        (steps, `time.perf_counter()` before the first step, the same after each epoch's
        last step).
    """
    import tensorflow as tf

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(labels, model(features, training=True)))
            if model.losses:
                loss += tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    steps, ends = 0, []
    started = time.perf_counter()
    for _ in range(epochs):
        for features, labels in dataset:
            loss = step(features, labels)
            steps += 1
        float(loss)  # the epoch's last step has run
        ends.append(time.perf_counter())
    return steps, started, ends


def wire_seconds(steps, nbytes):
    """Seconds raw gRPC takes to move `nbytes` up and `nbytes` down, `steps` times."""
    from bench.raw_grpc import RawPeer

    chunks = [DEFAULT_CHUNK_BYTES] * (nbytes // DEFAULT_CHUNK_BYTES)
    if nbytes % DEFAULT_CHUNK_BYTES:
        chunks.append(nbytes % DEFAULT_CHUNK_BYTES)
    blocks = [bytes(size) for size in chunks]
    with ChildServer("bench.raw_grpc") as server:
        peer = RawPeer(server.address)
        try:
            peer.exchange(nbytes, nbytes)  # the connection, before the clock starts
            started = time.perf_counter()
            for _ in range(steps):
                if len(chunks) == 1:
                    peer.exchange(nbytes, nbytes)
                else:
                    peer.send(blocks)
                    peer.receive(chunks)
            return time.perf_counter() - started
        finally:
            peer.close()


def limit_side(spec, dataset, records, epochs):
    """Prints {"value": examples/s, "rss": MB, "compute_s", "wire_s", "steps", "bytes"}."""
    steps, compute_s, nbytes = train_loop(spec, dataset, epochs)
    wire_s = wire_seconds(steps, nbytes)
    print(json.dumps({"value": records * epochs / (compute_s + wire_s), "rss": peak_rss_mb(),
                      "compute_s": round(compute_s, 2), "wire_s": round(wire_s, 2),
                      "steps": steps, "bytes_each_way": nbytes,
                      "measured_s": round(compute_s + wire_s, 1)}))
