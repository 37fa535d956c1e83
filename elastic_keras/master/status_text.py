"""`elastic-keras status`: a running job's status page as text, for a terminal."""


def format_status(snapshot):
    """The text of a `StatusView.snapshot()`: the job, its progress, workers, parameter
    servers, the last evaluation and recent failures."""
    job, progress = snapshot["job"], snapshot["progress"]
    lines = [f"Job {job['name']} ({job['type']}, engine {job['engine']}): {job['state']}, "
             f"{job['elapsed_s']:.0f} s"]
    facts = []
    if progress.get("epoch"):
        facts.append(f"epoch {progress['epoch']}/{progress['num_epochs']}")
    if progress.get("records_total"):
        facts.append(f"records {progress['records_done']}/{progress['records_total']}")
    facts += [f"version {progress['model_version']}",
              f"{progress['examples_per_second']:.0f} examples/s",
              f"loss {_number(progress['loss'], 4)}",
              f"{progress.get('tasks_waiting', '-')} tasks waiting",
              f"{progress['relaunches']} relaunches"]
    lines.append("  " + ", ".join(facts))
    lines.append(_table(
        ["worker", "state", "host", "launch", "task", "heartbeat"],
        [[f"worker-{w['id']}", w["state"], w["host"] or "-", _text(w["launch"]),
          _task(w["task"]), _ago(w["heard_s_ago"])] for w in snapshot["workers"]]))
    lines.append(_table(
        ["shard", "state", "address", "version", "rows", "memory", "received", "sent",
         "heartbeat"],
        [[f"ps-{s['id']}", s["state"], s["address"] or "-", str(s["version"]),
          str(sum(s["table_rows"].values())), _mib(s["memory_bytes"]),
          _mib(s["bytes_received"]), _mib(s["bytes_sent"]), _ago(s["heard_s_ago"])]
         for s in snapshot["ps"]]))
    if snapshot.get("tables"):  # an older master's snapshot has none
        lines.append(_table(
            ["table", "rows", "memory", "admitted", "evicted", "not admitted", "dropped"],
            [[name, str(t["rows"]), _mib(t["bytes"]),
              *(str(t[k]) for k in ("admitted", "evicted", "not_admitted_lookups",
                                    "dropped_gradients"))]
             for name, t in ((n, per["total"]) for n, per in snapshot["tables"].items())]))
    for evaluation in snapshot["evaluations"][-1:]:
        metrics = ", ".join(f"{k} {_number(v, 4)}" for k, v in evaluation["metrics"].items())
        lines.append(f"  last evaluation (version {evaluation['model_version']}): {metrics}")
    for event in snapshot["events"][:5]:
        lines.append(f"  {event['role']} {event['what']} (relaunched {event['relaunches']}x)")
    return "\n".join(lines)


def _table(header, rows):
    if not rows:
        return f"  no {header[0]}s yet"
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    return "\n".join("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in [header] + rows)


def _task(task):
    if not task:
        return "-"
    name = task["file"].rsplit("/", 1)[-1]
    return (f"{task['type']} {name} [{task['start']}, {task['end']}) "
            f"{task['records_done']}/{task['end'] - task['start']}")


def _number(value, digits):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.{digits}f}"
    return "-" if value is None else str(value)


def _text(value):
    return "-" if value is None else str(value)


def _ago(seconds):
    return "-" if seconds is None else f"{seconds:.1f} s ago"


def _mib(count):
    return f"{count / 2**20:.{1 if count < 10 * 2**20 else 0}f} MiB" if count else "-"
