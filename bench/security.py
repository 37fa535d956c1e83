"""The cost of TLS between roles (`python -m bench security [--quick]`): the same
elastic_keras jobs with `--tls auto` and without, one after the other in one run.

Every call carries its credential in both (authentication is always on); what differs is
mutual TLS on every channel. Dense: the MNIST MLP, batch 64, 1 worker and 1 PS, 4,000
records, 2 passes; sparse: DeepFM on a 1M-row table, 2 workers and 1 PS, 16,384 records, 2
passes. The full run measures each pair twice, in alternating order, and reports the
medians; `--quick` once.
"""

import statistics

from bench import dense, deepfm
from bench.common import attempt, emit, mnist_records, run_child, run_side

SIDES = ("off", "auto")


def _measure(label, repeats, command):
    """`{tls: [result, ...]}` of `command(tls)` run `repeats` times per side, alternating."""
    results = {tls: [] for tls in SIDES}
    for repeat in range(repeats):
        for tls in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            result, error = run_side(f"{label} tls {tls}", *command(tls))
            if error:
                return None, error
            results[tls].append(result)
    return results, None


def _emit(name, config, results, error):
    if error:
        emit(name, config, None, "examples/s", None, error=error)
        return
    median = {tls: statistics.median(r["value"] for r in runs) for tls, runs in results.items()}
    emit(name, {**config, "runs_per_side": len(results["auto"])}, median["auto"],
         "examples/s", max(r["rss"] for r in results["auto"]), peer="no_tls",
         peer_value=median["off"])


def run(quick, work_dir):
    repeats = 1 if quick else 2
    records, error = attempt("preparing MNIST records", mnist_records, work_dir)
    if not error:
        results, error = _measure("dense", repeats, lambda tls: (
            run_child, "bench.dense", "elastic", records, "mnist_mlp", 64,
            dense.QUICK_EPOCHS, 1, tls))
    _emit("security/dense_tls", {"model": "mnist_mlp", "batch": 64, "workers": 1, "ps": 1},
          None if error else results, error)
    data, error = attempt("generating click records", deepfm.click_records, work_dir,
                          deepfm.QUICK_RECORDS)
    if not error:
        results, error = _measure("sparse", repeats, lambda tls: (
            run_child, "bench.deepfm", "elastic", data, 1_000_000, 1, 2, deepfm.WORKERS, tls))
    _emit("security/sparse_tls", {"model": "deepfm", "rows": 1_000_000, "workers": 2, "ps": 1},
          None if error else results, error)
