"""The job locator: where running masters can be found by job name, for `elastic-keras scale`.

A master records `{"job_name", "address", "pid", "started"}` in
`$ELASTIC_KERAS_HOME/jobs/<job name>.json` (default home: `~/.cache/elastic_keras`) while it
runs, and removes the file when it ends. An entry whose process is gone (a master that was
killed) is stale: `find` says so, and the next master of that name replaces it.

Example:

    >>> register("demo", "127.0.0.1:5000", home="/tmp/ek-locator-doc")
    >>> find("demo", home="/tmp/ek-locator-doc")["address"]
    '127.0.0.1:5000'
    >>> unregister("demo", home="/tmp/ek-locator-doc")
"""

import json
import logging
import os
import re
import time

from elastic_keras.common.atomic_file import atomic_write
from elastic_keras.common.errors import ConfigError

logger = logging.getLogger(__name__)

HOME_ENV = "ELASTIC_KERAS_HOME"
DEFAULT_HOME = os.path.join("~", ".cache", "elastic_keras")


def jobs_dir(home=""):
    home = home or os.environ.get(HOME_ENV) or DEFAULT_HOME
    return os.path.join(os.path.expanduser(home), "jobs")


def _entry_path(job_name, home=""):
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_name)
    return os.path.join(jobs_dir(home), f"{safe}.json")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register(job_name, address, home="", credential="", tls=None, status_url=""):
    """Records that this process runs the master of `job_name` at `address`, with the
    `credential` its commands (`elastic-keras scale`) call it with and their `tls` material
    (a `TlsMaterial`) when the job runs TLS, and its status page's `status_url` (for
    `elastic-keras status`), in a file only this user can read.

    Never fails the job: an unwritable locator only loses `elastic-keras scale` by name.
    """
    path = _entry_path(job_name, home)
    try:
        old = _read(path)
        if old and old.get("pid") != os.getpid() and _alive(old.get("pid", -1)):
            logger.warning(
                "Another master (pid %d, at %s) also runs a job named %r; `elastic-keras "
                "scale --job-name %s` now reaches this one.", old["pid"], old.get("address"),
                job_name, job_name,
            )
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with atomic_write(path, "w", private=True) as f:
            json.dump({"job_name": job_name, "address": address, "pid": os.getpid(),
                       "started": time.time(), "credential": credential,
                       "status_url": status_url,
                       "tls": tls and {"ca": tls.ca.decode(), "cert": tls.cert.decode(),
                                       "key": tls.key.decode(),
                                       "target_name": tls.target_name}}, f)
    except OSError as exc:
        logger.warning("Could not record the job in %s (%s); `elastic-keras scale` cannot "
                       "reach it.", path, exc)


def unregister(job_name, home=""):
    """Removes this process's entry for `job_name` (another master's is left alone)."""
    path = _entry_path(job_name, home)
    entry = _read(path)
    if entry and entry.get("pid") == os.getpid():
        try:
            os.remove(path)
        except OSError:
            pass


def find(job_name, home=""):
    """The entry of the running master of `job_name`.

    Raises:
        ConfigError: no master of that name runs on this machine (naming the jobs that do).
    """
    entry = _read(_entry_path(job_name, home))
    if entry and _alive(entry.get("pid", -1)):
        return entry
    running = sorted(e["job_name"] for e in _entries(home) if _alive(e.get("pid", -1)))
    state = "its master has exited" if entry else "no master of that name has run here"
    raise ConfigError(
        f"No running job named {job_name!r} on this machine ({state}). Running jobs: "
        f"{', '.join(running) or 'none'}."
    )


def _entries(home=""):
    directory = jobs_dir(home)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    entries = []
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            entry = _read(os.path.join(directory, name))
            if entry:
                entries.append(entry)
    return entries


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
        return None
    return entry
