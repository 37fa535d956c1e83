"""The ParameterServerStrategy peer: a real TensorFlow parameter-server cluster on 127.0.0.1.

`train(model, files, batch, steps, workers, ps)` starts, each in its own process:

- `ps` parameter-server tasks and `workers` worker tasks: `tf.distribute.Server`s of a
  `ClusterSpec` on free ports of 127.0.0.1, serving until their stdin closes;
- the chief (coordinator), one more process than elastic_keras's side has (whose master
  hands out tasks but runs no training step): `ParameterServerStrategy` with a
  `MinSizePartitioner` over the PS (a table larger than 256 KB is split into one shard per
  PS; smaller variables go whole to one PS, round-robin), tf_keras `model.fit` on a
  `DatasetCreator`: each worker reads the records through the Keras 3 module's own input
  function, in minibatches as elastic_keras's workers do, and runs the steps the coordinator
  schedules, reading and updating the variables on the PS. `steps_per_execution` is the largest divisor of `steps`
  up to 10, as TensorFlow's guide to the strategy recommends (fewer round trips from the
  chief; every step still reads and updates the variables on the PS).

The figure is examples/s: `steps * batch` over the time of the `fit` call (tracing included,
as elastic_keras's and plain fit's figures include theirs). `train` kills every process it
started before returning or raising.

Run alone: `python -m bench.pss chief CLUSTER SPEC` and `python -m bench.pss server CLUSTER
JOB INDEX` are the roles (CLUSTER and SPEC are JSON); `bench.dense` and `bench.deepfm`
call `train`.
"""

import json
import sys
import time

from bench.common import HOST, Children, free_ports, peak_rss_mb, process_peak_rss_mb, run_child

MAX_STEPS_PER_EXECUTION = 10


def steps_per_execution(steps):
    """The largest divisor of `steps` no greater than `MAX_STEPS_PER_EXECUTION`."""
    return max(n for n in range(1, MAX_STEPS_PER_EXECUTION + 1) if steps % n == 0)


def train(model, files, batch, steps, workers, ps, rows=0, timeout_s=900):
    """Trains `model` for `steps` steps of `batch` records on a local cluster.

    Args:
        model: a name in `bench.pss_models.MODELS`.
        files: the TFRecord files of the training records (read again from the start when
            a worker has read them all).
        batch, steps: records per step, and steps in all (spread over the workers).
        workers, ps: task counts (the chief comes on top).
        rows: the embedding tables' rows (DeepFM).

    Returns:
        `{"value": examples/s, "rss": {"chief": MB, "ps": [MB...], "worker": [MB...]},
        "steps_per_execution": n, "measured_s": seconds of the fit call}`.

    Raises:
        ChildError: a process failed or timed out.
    """
    ports = free_ports(ps + workers + 1)
    cluster = {
        "chief": [f"{HOST}:{ports[0]}"],
        "worker": [f"{HOST}:{p}" for p in ports[1:1 + workers]],
        "ps": [f"{HOST}:{p}" for p in ports[1 + workers:]],
    }
    spec = {"model": model, "files": [str(f) for f in files], "batch": batch, "steps": steps,
            "rows": rows}
    with Children() as children:
        servers = {job: [children.start("bench.pss", "server", json.dumps(cluster), job, i)
                         for i in range(len(cluster[job]))]
                   for job in ("ps", "worker")}
        for process in servers["ps"] + servers["worker"]:
            children.expect(process, "ready")
        result = run_child("bench.pss", "chief", json.dumps(cluster), json.dumps(spec),
                           timeout_s=timeout_s)
        result["rss"] = {"chief": round(result["rss"], 1), **{
            job: [round(process_peak_rss_mb(p.pid), 1) for p in processes]
            for job, processes in servers.items()}}
    return result


def serve(cluster, job, index):
    """One PS or worker task: serves until stdin closes, then exits at once."""
    import os

    import tensorflow as tf

    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=int(index),
                         protocol="grpc", start=True)
    print("ready", flush=True)
    sys.stdin.read()
    os._exit(0)  # the server has no clean stop; nothing is left to flush


def chief(cluster, spec):
    """The coordinator: builds the model under the strategy, fits, prints the result."""
    import tensorflow as tf
    import tf_keras

    from bench.pss_models import MODELS

    model_spec = MODELS[spec["model"]]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            max_shards=len(cluster["ps"])))
    per_execution = steps_per_execution(spec["steps"])
    with strategy.scope():
        model = model_spec.build(spec["rows"])
        model.compile(optimizer=model_spec.optimizer(), loss=model_spec.loss(),
                      steps_per_execution=per_execution)

    def dataset_fn(input_context):
        records = tf.data.TFRecordDataset(spec["files"]).repeat()
        return model_spec.minibatches(records, spec["batch"]).prefetch(tf.data.AUTOTUNE)

    started = time.perf_counter()
    model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1,
              steps_per_epoch=spec["steps"], verbose=0)
    elapsed = time.perf_counter() - started
    print(json.dumps({"value": spec["steps"] * spec["batch"] / elapsed, "rss": peak_rss_mb(),
                      "steps_per_execution": per_execution, "measured_s": round(elapsed, 1)}))


def main():
    role, cluster, *rest = sys.argv[1:]
    if role == "server":
        serve(json.loads(cluster), *rest)
    elif role == "chief":
        chief(json.loads(cluster), json.loads(rest[0]))
    else:
        raise SystemExit(f"usage: python -m bench.pss {{server,chief}} ...; got {role!r}")


if __name__ == "__main__":
    main()
