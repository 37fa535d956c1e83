"""Finding every process a test started, however deep, by a variable in its environment."""

import os


def alive(pid):
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def marked_processes(name, value):
    """Pids of the live processes whose environment holds `name=value` (children inherit
    it: Ray's head, its agents, actors and their roles all do)."""
    needle = f"{name}={value}".encode() + b"\0"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    found.append(int(pid))
        except OSError:
            continue
    return [pid for pid in found if int(pid) != os.getpid() and alive(pid)]


def describe(pids):
    """`pid (parent) command` of each of `pids`, for a failure message."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
            found.append(f"{pid} ({parent}) {command}")
        except OSError:
            continue
    return found
