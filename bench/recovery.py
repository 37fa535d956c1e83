"""How long a job takes to recover from a lost worker and from a lost parameter server.

`python -m bench recovery [--quick]` trains the MNIST CNN (`elastic-keras train`, 2 workers,
2 PS, checkpoints every 20 versions) and, once the job trains, SIGKILLs worker-0, then ps-1,
(each `--repeats` times, 2 by default, 1 with --quick), each time after the job has recovered
from the previous fault. The times come from the timestamps of the job's own log lines, all
on this machine's clock, counted from the kill:

- `recovery/worker_detected`: the master has noticed the exit and re-queued the tasks;
- `recovery/worker_task_elsewhere`: another worker has taken the lost task over (it asks
  for a task when it finishes the one it is on, so this includes the rest of that task);
- `recovery/worker_replaced`: the relaunched worker has built its model and is ready;
- `recovery/ps_restored`: the relaunched parameter server has restored its shard;
- `recovery/ps_training_resumed`: the relaunched parameter server has applied its first
  push (workers' calls wait for it through gRPC's wait-for-ready, so they may never see an
  error to log).
"""

import argparse
import datetime
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

from bench.common import CHILD_ENV, ROOT, emit, mnist_records

TIMEOUT_S = 300.0
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _stamps(path, pattern):
    """Wall-clock times (s) of the log lines of `path` that contain `pattern`."""
    try:
        text = pathlib.Path(path).read_text(errors="replace")
    except OSError:
        return []
    times = []
    for line in text.splitlines():
        match = _STAMP.search(line)
        if match and pattern in line:
            stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            times.append(stamp.timestamp())
    return times


def _first_after(paths, pattern, since, timeout_s=TIMEOUT_S):
    """The first time after `since` that a line with `pattern` appears in one of `paths`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [t for p in paths for t in _stamps(p, pattern) if t >= since - 0.001]
        if found:
            return min(found)
        time.sleep(0.2)
    raise TimeoutError(f"no line with {pattern!r} in {[str(p) for p in paths]} within "
                       f"{timeout_s:.0f} s")


def _pid(job, role, index):
    prefix = f"elastic_keras.{role} --{role}-id {index} "
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().decode("utf-8", "replace").replace("\0", " ")
        except OSError:
            continue
        if prefix in cmd and job in cmd:
            return int(entry)
    return None


def _wait_checkpoint(master_log, since):
    return _first_after([master_log], "Checkpoint ", since)


def run(quick=False, repeats=None):
    repeats = repeats or (1 if quick else 2)
    with tempfile.TemporaryDirectory(prefix="ek-recovery-") as work:
        work = pathlib.Path(work)
        records = mnist_records(work / "mnist")
        job, out = f"bench-recovery-{os.getpid()}", work / "out"
        master_log = work / "master.log"
        config = {"model": "mnist_functional", "workers": 2, "ps": 2, "minibatch": 64,
                  "checkpoint_steps": 20}
        with open(master_log, "w") as log:
            master = subprocess.Popen(
                [sys.executable, "-m", "elastic_keras", "train", "--model-zoo", "model_zoo",
                 "--model-def", "mnist.mnist_functional", "--training-data",
                 str(records / "train"), "--num-workers", "2", "--num-ps", "2",
                 "--minibatch-size", "64", "--num-epochs", "100", "--checkpoint-dir",
                 str(work / "ckpt"), "--checkpoint-steps", "20", "--output", str(out),
                 "--job-name", job],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **CHILD_ENV},
            )
        logs = out / "logs"
        try:
            _wait_checkpoint(master_log, 0)
            for _ in range(repeats):
                killed = time.time()
                os.kill(_pid(job, "worker", 0), signal.SIGKILL)
                detected = _first_after([master_log], "worker-0 exited with code -9", killed)
                elsewhere = _first_after([master_log], "takes over training records", killed)
                replaced = _first_after([logs / "worker-0.log"], "Model built", killed)
                for name, at in (("worker_detected", detected),
                                 ("worker_task_elsewhere", elsewhere),
                                 ("worker_replaced", replaced)):
                    emit(f"recovery/{name}", config, at - killed, "s", None)
                _wait_checkpoint(master_log, time.time())
            for _ in range(repeats):
                killed = time.time()
                os.kill(_pid(job, "ps", 1), signal.SIGKILL)
                restored = _first_after([logs / "ps-1.log"], "Restored shard 1", killed)
                resumed = _first_after([logs / "ps-1.log"], "applied its first push", killed)
                emit("recovery/ps_restored", config, restored - killed, "s", None)
                emit("recovery/ps_training_resumed", config, resumed - killed, "s", None)
                _wait_checkpoint(master_log, time.time())
        finally:
            master.send_signal(signal.SIGINT)
            try:
                master.wait(timeout=60)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    run(args.quick, args.repeats)


if __name__ == "__main__":
    main()
