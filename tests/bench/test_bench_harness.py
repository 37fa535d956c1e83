"""The benchmark harness: result lines, child processes and their clean-up, the peers'
models matching ours. Fast; the one real ParameterServerStrategy cluster is `slow`."""

import json
import os
import time

import pytest

from bench import common, dense, pss


def _lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_emit_has_every_key_and_the_ratio(capsys):
    common.emit("suite/x", {"a": 1}, 30.0, "examples/s", 12.34, peer="p", peer_value=20.0)
    (line,) = _lines(capsys)
    assert line == {"name": "suite/x", "config": {"a": 1}, "value": 30.0,
                    "unit": "examples/s", "peak_rss_mb": 12.3, "peer": "p",
                    "peer_value": 20.0, "ratio": 1.5}


def test_emit_a_failed_side_gives_null_and_an_error(capsys):
    common.emit("suite/x", {}, 30.0, "examples/s", 1.0, peer="p", peer_value=None,
                error="p: boom")
    common.emit("suite/y", {}, None, "examples/s", None, error="ours: boom")
    first, second = _lines(capsys)
    assert first["peer_value"] is None and first["ratio"] is None
    assert first["error"] == "p: boom"
    assert second["value"] is None and second["ratio"] is None
    assert second["error"] == "ours: boom"


def test_attempt_turns_an_exception_into_an_error_text():
    def fail():
        raise ValueError("bad thing")

    assert common.attempt("side", lambda: 3) == (3, None)
    result, error = common.attempt("side", fail)
    assert result is None and error == "side: ValueError: bad thing"
    assert common.errors(None, "a", "", "b") == "a; b"
    assert common.errors(None) is None


def test_run_side_adds_its_wall_time():
    result, error = common.run_side("side", lambda: {"value": 1.0})
    assert error is None and result["value"] == 1.0 and result["wall_s"] >= 0
    assert common.side_times(ours=result, peer=None) == {"ours": {"wall_s": result["wall_s"]}}


def test_free_ports_are_distinct_and_bindable():
    import socket

    ports = common.free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_run_child_returns_the_last_json_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"value": 2}')
    assert common.run_child("json.tool", "--compact", path) == {"value": 2}


def test_run_child_failure_and_timeout_raise_child_error(tmp_path):
    with pytest.raises(common.ChildError, match="exited with"):
        common.run_child("json.tool", tmp_path / "missing.json")
    started = time.monotonic()
    with pytest.raises(common.ChildError, match="ran past"):
        common.run_child("http.server", "0", "--bind", "127.0.0.1", timeout_s=1)
    assert time.monotonic() - started < 15


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_children_are_ended_with_their_descendants_even_on_error():
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "print(p.pid, flush=True); time.sleep(600)")
    with pytest.raises(RuntimeError, match="inside"):
        with common.Children() as children:
            child = children.start("bench.pss", "unused")  # exits at once: bad role
            child.wait(timeout=60)
            process = children.start("timeit", "-n", "1", code)
            grandchild = int(children.read_line(process, timeout_s=60))
            raise RuntimeError("inside the block")
    deadline = time.monotonic() + 10
    while (_alive(process.pid) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(process.pid) and not _alive(grandchild)


def test_read_line_gives_up_on_a_silent_child():
    with common.Children() as children:
        silent = children.start("timeit", "-n", "1", "import time; time.sleep(600)")
        with pytest.raises(common.ChildError, match="printed nothing"):
            children.read_line(silent, timeout_s=0.5)


def test_the_raw_grpc_peer_moves_bytes_and_its_server_exits_with_stdin():
    from bench.raw_grpc import RawPeer

    server = common.ChildServer("bench.raw_grpc")
    try:
        peer = RawPeer(server.address)
        peer.send([b"x" * 1000, b"y" * 10])
        peer.receive([5, 1 << 20])
        peer.exchange(100, 1 << 16)
        peer.close()
    finally:
        server.close()
    assert server._process.returncode == 0


def test_pss_steps_and_steps_per_execution():
    assert pss.steps_per_execution(60) == 10
    assert pss.steps_per_execution(32) == 8
    assert pss.steps_per_execution(7) == 7
    assert pss.steps_per_execution(31) == 1
    assert dense.pss_steps(4000, 64) == 60
    assert dense.pss_steps(4000, 512) == 8
    assert dense.pss_steps(20000, 512) == 40


@pytest.mark.parametrize("name", ["mnist_cnn", "mnist_mlp", "deepfm"])
def test_the_tf_keras_rebuilds_match_the_keras_3_models(name, monkeypatch):
    """Same layers in the same order with the same weight shapes: the same architecture."""
    pytest.importorskip("tf_keras")
    from bench.models import deepfm_hashed, mnist_mlp
    from bench.pss_models import MODELS
    from model_zoo.mnist import mnist_functional

    rows = 1000
    ours = {"mnist_cnn": mnist_functional.custom_model, "mnist_mlp": mnist_mlp.custom_model,
            "deepfm": lambda: deepfm_hashed.build_model(rows, plain=True)}[name]()
    theirs = MODELS[name].build(rows)
    assert ([tuple(w.shape) for w in ours.weights]
            == [tuple(w.shape) for w in theirs.weights])
    assert type(MODELS[name].optimizer()).__name__ == "Adam"
    assert float(MODELS[name].optimizer().learning_rate) == pytest.approx(
        0.002 if name == "deepfm" else 0.001)


def test_deepfm_hashed_tables_are_on_the_parameter_servers(monkeypatch):
    from bench.models import deepfm_hashed
    from elastic_keras.layers.embedding import Embedding

    monkeypatch.setenv(deepfm_hashed.ROWS_VARIABLE, "5000")
    model = deepfm_hashed.custom_model()
    tables = [layer for layer in model.layers if isinstance(layer, Embedding)]
    assert sorted((t.name, t.output_dim, t.input_dim) for t in tables) == [
        ("fm_factors", 16, 5000), ("fm_linear", 1, 5000)]


@pytest.mark.slow
def test_a_real_pss_cluster_trains_and_leaves_no_process(tmp_path):
    pytest.importorskip("tf_keras")
    from model_zoo.deepfm.generate import generate

    files, _ = generate(str(tmp_path / "clicks"), 2048, num_shards=2)
    before = set(os.listdir("/proc"))
    result = pss.train("deepfm", files, 256, 4, 1, 2, rows=10_000, timeout_s=300)
    assert result["value"] > 0 and result["steps_per_execution"] == 4
    assert len(result["rss"]["ps"]) == 2 and len(result["rss"]["worker"]) == 1
    leftover = [pid for pid in set(os.listdir("/proc")) - before
                if pid.isdigit() and _alive(int(pid))
                and "bench.pss" in open(f"/proc/{pid}/cmdline").read()]
    assert leftover == []


def test_the_codec_benchmark_runs_the_wire_path(capsys, monkeypatch):
    from bench import codec

    monkeypatch.setattr(codec, "CHUNK", 64 << 10)
    codec.run(quick=True)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    streams = [line for line in lines if line["name"] == "codec/stream"]
    assert streams and all(line["value"] > 0 for line in streams)
    ratios = {(r["config"]["payload"], r["config"]["codec"]): r["value"]
              for r in lines if r["name"] == "codec/ratio"}
    assert ratios[("zero90_float32", "lz4")] > 3 and ratios[("dense_float32", "none")] <= 1


def test_every_phase_the_phases_bench_times_exists():
    """A renamed function would leave its phase untimed: every one must resolve."""
    import importlib

    from bench import phases

    for phase, (module_name, class_name, attribute) in phases.PHASES.items():
        module = importlib.import_module(module_name)
        owner = getattr(module, class_name) if class_name else module
        assert callable(getattr(owner, attribute, None)), phase


def test_bench_minibatches_come_through_the_model_spec(tmp_path):
    import tensorflow as tf

    from bench.deepfm import click_records
    from elastic_keras.common.errors import ModelSpecError

    files = sorted(str(p) for p in click_records(tmp_path, 600).glob("*.tfrecord"))
    batches = list(common.minibatches("model_zoo.deepfm.deepfm",
                                      tf.data.TFRecordDataset(files), 256))
    assert sorted(labels.shape[0] for _, labels in batches) == [88, 256, 256]
    assert batches[0][0]["cat"].shape == (256, 26)
    with pytest.raises(ModelSpecError, match="model_zoo.nowhere"):
        common.minibatches("model_zoo.nowhere", tf.data.TFRecordDataset(files), 256)


def test_the_dense_limit_trains_every_step_and_moves_its_bytes_both_ways():
    import numpy as np
    import tensorflow as tf

    from bench import dense_limit
    from elastic_keras.common.model_spec import load_model_spec

    spec = load_model_spec(str(common.ROOT), "bench.models.mnist_mlp")
    rng = np.random.default_rng(0)
    images = rng.random((96, 28, 28), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(
        (images, rng.integers(0, 10, 96))).batch(32)
    steps, seconds, nbytes = dense_limit.train_loop(spec, dataset, 2)
    assert steps == 6 and seconds > 0
    assert nbytes == 4 * (784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10)
    # one unary call a step, and a step over the chunk size streamed in chunks each way
    assert dense_limit.wire_seconds(3, nbytes) > 0
    assert dense_limit.wire_seconds(2, dense_limit.DEFAULT_CHUNK_BYTES + 1000) > 0


@pytest.mark.parametrize("side", ["fit_side", "loop_side"])
def test_a_deepfm_single_process_side_trains_every_record_and_answers_one_line(
        side, tmp_path, capsys):
    """The `keras_fit` and `tf_function_loop` peers of `sparse/deepfm`: 600 records, 2
    epochs, small tables."""
    from bench import deepfm

    data = deepfm.click_records(tmp_path, 600)
    capsys.readouterr()  # the generator's output
    getattr(deepfm, side)(data, 1000, 600, 2)
    [result] = _lines(capsys)
    assert result["value"] > 0 and result["steady"] > 0 and result["measured_s"] > 0
