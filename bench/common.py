"""Shared pieces of the benchmarks: result lines, child processes, ports, data preparation.

Every result is one JSON line (`emit`). Every process a benchmark starts is a child of this
package's helpers (`run_child`, `Children`, `ChildServer`), started in a session of its own
and ended with its whole process group when the benchmark is done with it, on error too;
servers also exit on their own when their parent's end of their stdin closes.
"""

import contextlib
import gzip
import json
import os
import pathlib
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
HOST = "127.0.0.1"
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR", "CUDA_VISIBLE_DEVICES": "",
             "PYTHONUNBUFFERED": "1"}
DEFAULT_TIMEOUT_S = 900


class ChildError(RuntimeError):
    """A child process failed, timed out or answered something unexpected."""


def _rounded(value, digits=1):
    return None if value is None else round(value, digits)


def minibatches(model_def, records, batch, mode="training"):
    """Minibatches of `records` (a dataset of serialized records) through the input function of
    the model-zoo module `model_def` (dotted, from the repository root), exactly as a worker
    reads them: `ModelSpec.minibatches`, with its contract checks."""
    from elastic_keras.common.model_spec import Mode, load_model_spec

    return load_model_spec(str(ROOT), model_def).minibatches(records, Mode(mode), None, batch)


def emit(name, config, value, unit, peak_rss_mb, peer=None, peer_value=None, error=None):
    """Prints one result as a JSON line.

    Args:
        name: the result's name, `suite/what`.
        config: a JSON-able dict: what was measured, under which settings.
        value: the measured figure, or None when this side failed (then pass `error`).
        unit: e.g. "examples/s", "MB/s", "rows/s", "ms".
        peak_rss_mb: the largest resident set of a process of the measured side, in MB.
        peer: what the value is compared with, or None.
        peer_value: the peer's figure, or None (no peer, or it failed: pass `error`).
        error: why a side has no figure.
    """
    ratio = round(value / peer_value, 3) if value is not None and peer_value else None
    record = {
        "name": name, "config": config, "value": _rounded(value), "unit": unit,
        "peak_rss_mb": _rounded(peak_rss_mb), "peer": peer,
        "peer_value": _rounded(peer_value), "ratio": ratio,
    }
    if error:
        record["error"] = error
    print(json.dumps(record), flush=True)


def error_text(exc, limit=600):
    """A short, one-paragraph description of `exc` for a result's `error` key."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[:limit // 3] + " ... " + text[-2 * limit // 3:]


def attempt(what, fn, *args, **kwargs):
    """Calls `fn`; returns `(result, None)`, or `(None, "what: error")` if it raised.

    The traceback goes to stderr, so that one failing side or suite never ends a run.
    """
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 (a failing side is data, not a crash)
        print(f"bench: {what} failed:", file=sys.stderr)
        traceback.print_exc()
        return None, f"{what}: {error_text(exc)}"


def run_side(what, fn, *args, **kwargs):
    """`attempt` for one side of a comparison, whose result is a dict: it gains "wall_s",
    the seconds the side took in all, process start-up included."""
    started = time.perf_counter()
    result, error = attempt(what, fn, *args, **kwargs)
    if result is not None:
        result["wall_s"] = round(time.perf_counter() - started, 1)
    return result, error


def side_times(**results):
    """`{side: {"wall_s": ..., "measured_s": ...}}` of the sides that ran, for a config."""
    return {name: {key: r[key] for key in ("wall_s", "measured_s") if key in r}
            for name, r in results.items() if r}


def errors(*texts):
    """The non-empty error texts of a result's sides joined, or None if there are none."""
    return "; ".join(t for t in texts if t) or None


def peak_rss_mb():
    """The largest resident set of this process and any child it waited for, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def process_peak_rss_mb(pid):
    """The largest resident set so far (VmHWM) of the live process `pid`, in MB (0 if gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (held together while they are picked)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _child_env(env):
    return {**os.environ, **CHILD_ENV, **(env or {})}


def _end_group(process, grace_s=5.0):
    """Ends `process` and every process of its session: SIGTERM, then SIGKILL after
    `grace_s` seconds. The process must have been started with `start_new_session=True`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Its descendants (roles of a job, say) may outlive it: kill whatever is left of the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_child(module, *args, env=None, timeout_s=DEFAULT_TIMEOUT_S, json_result=True):
    """Runs `python -m module args` and returns the JSON object it prints last (or, with
    `json_result=False`, all it printed).

    The child runs in a session of its own; on a timeout, an error or an interrupt, it and
    everything it started are killed.

    Raises:
        ChildError: it exited with an error, ran past `timeout_s` or printed no JSON.
    """
    what = f"python -m {module} {' '.join(map(str, args))}"
    process = subprocess.Popen(
        [sys.executable, "-m", module, *map(str, args)], cwd=ROOT, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(env),
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ChildError(f"{what} ran past {timeout_s} s and was killed") from None
    finally:
        _end_group(process)
    if process.returncode != 0:
        raise ChildError(f"{what} exited with {process.returncode}:\n{stderr[-2000:]}")
    if not json_result:
        return stdout
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ChildError(f"{what} printed no JSON result:\n{stdout[-500:]}\n"
                         f"{stderr[-1500:]}") from None


def run_lines(module, *args, env=None, timeout_s=DEFAULT_TIMEOUT_S):
    """Runs `python -m module args` with this process's stdout and stderr, so that the
    result lines it prints are this run's; it and everything it started are killed on a
    timeout, an error or an interrupt.

    Raises:
        ChildError: it exited with an error or ran past `timeout_s`.
    """
    what = f"python -m {module} {' '.join(map(str, args))}"
    sys.stdout.flush()
    process = subprocess.Popen(
        [sys.executable, "-m", module, *map(str, args)], cwd=ROOT, stdin=subprocess.DEVNULL,
        env=_child_env(env), start_new_session=True,
    )
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ChildError(f"{what} ran past {timeout_s} s and was killed") from None
    finally:
        _end_group(process)
    if process.returncode != 0:
        raise ChildError(f"{what} exited with {process.returncode} (its stderr is above)")


class Children:
    """Long-running child processes (servers) of one measurement.

    Each is `python -m MODULE ARGS...`, with a pipe to its stdin that it watches (so it exits
    if this process dies) and its stdout readable line by line. Leaving the `with` block ends
    every one of them and their descendants, whatever happened inside.

    Example:

        >>> with Children() as children:  # doctest: +SKIP
        ...     ps = children.start("bench.pss", "server", cluster, "ps", 0)
        ...     children.expect(ps, "ready")
    """

    def __init__(self):
        self._processes = []

    def start(self, module, *args, env=None):
        """Starts `python -m module args`; returns its `subprocess.Popen`."""
        process = subprocess.Popen(
            [sys.executable, "-m", module, *map(str, args)], cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env(env),
            start_new_session=True,
        )
        process.what = f"python -m {module} {' '.join(map(str, args))}"
        self._processes.append(process)
        return process

    def read_line(self, process, timeout_s=120.0):
        """The next line `process` prints, stripped.

        Raises:
            ChildError: it exited, or printed no line within `timeout_s` seconds.
        """
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChildError(f"{process.what} printed nothing within {timeout_s} s")
                if selector.select(min(left, 1.0)):
                    line = process.stdout.readline()
                    if not line:
                        raise ChildError(f"{process.what} exited with {process.wait()}")
                    return line.strip()
                if process.poll() is not None:
                    raise ChildError(f"{process.what} exited with {process.returncode}")

    def expect(self, process, expected, timeout_s=120.0):
        """Waits for `process` to print the line `expected`.

        Raises:
            ChildError: it printed something else first, exited or timed out.
        """
        line = self.read_line(process, timeout_s)
        if line != expected:
            raise ChildError(f"{process.what} printed {line!r}, expected {expected!r}")

    def close(self):
        """Ends every child (and its descendants); waits for them."""
        for process in self._processes:
            with contextlib.suppress(OSError):
                process.stdin.close()
        for process in self._processes:
            _end_group(process, grace_s=2.0)
            with contextlib.suppress(OSError):
                process.stdout.close()
        self._processes = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def mnist_records(work_dir):
    """MNIST 5k as TFRecord: 4,000 shuffled training rows in 2 files in `work_dir/records/train`."""
    import numpy as np

    out = pathlib.Path(work_dir)
    if (out / "records" / "train").is_dir():
        return out / "records"
    source = SHARED_DATA / "mnist_5k.csv.gz"
    if not source.exists():
        raise FileNotFoundError(f"the MNIST benchmarks need {source}")
    with gzip.open(source, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "mnist.npz", image=table[:, :784], label=table[:, 784])
    subprocess.run(
        [sys.executable, "-m", "elastic_keras", "data", str(out / "mnist.npz"), "--output",
         str(out / "records"), "--holdout-every", "5", "--shuffle", "--num-shards", "2"],
        cwd=ROOT, check=True, capture_output=True, env=_child_env(None),
    )
    return out / "records"


class ChildServer:
    """A `python -m MODULE serve ARGS...` child process: it prints the ports it serves on
    (one line, space-separated), then serves until its stdin closes (`close`). A child may
    also take requests, one line each, and answer each with a line of ports (`ask`)."""

    def __init__(self, module, *args):
        self._children = Children()
        self._process = self._children.start(module, "serve", *args)
        self._read_ports()

    def _read_ports(self):
        try:
            line = self._children.read_line(self._process, timeout_s=300)
        except ChildError:
            self.close()
            raise
        if not line.split() or not all(port.isdigit() for port in line.split()):
            self.close()
            raise ChildError(f"{self._process.what} did not answer with ports: {line!r}")
        self.addresses = [f"{HOST}:{int(port)}" for port in line.split()]
        self.address = self.addresses[0]

    def ask(self, request):
        """Sends the child one line; returns the addresses it then serves on."""
        self._process.stdin.write(request + "\n")
        self._process.stdin.flush()
        self._read_ports()
        return self.addresses

    def peak_rss_mb(self):
        """The child's largest resident set so far (VmHWM), in MB."""
        return process_peak_rss_mb(self._process.pid)

    def resident_mb(self):
        """The child's resident memory now, in MB."""
        try:
            with open(f"/proc/{self._process.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except OSError:
            return 0.0

    def close(self):
        """Closes its stdin (it stops serving and exits); kills it if it does not, in 30 s."""
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._children.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve_until_stdin_closes(servers_and_ports):
    """Prints the ports for the parent (`ChildServer`), then serves until stdin closes.

    Args:
        servers_and_ports: `(server, port)` pairs, as `rpc.create_server` returns them.
    """
    print(" ".join(str(port) for _, port in servers_and_ports), flush=True)
    sys.stdin.read()
    for server, _ in servers_and_ports:
        server.stop(0)


def epoch_seconds(started, ends):
    """Seconds of each epoch, from the start and the epochs' end times."""
    return [end - start for start, end in zip([started, *ends], ends)]


def steady_rate(records_per_epoch, seconds):
    """Examples/s of the epochs after the first, from each epoch's seconds (None with one
    epoch, or when one of them was not timed)."""
    later = seconds[1:]
    if not later or None in later:
        return None
    return records_per_epoch * len(later) / sum(later)
