"""What the person running a job sees: role log lines and one live progress line.

On a terminal the progress line is redrawn in place and log lines print above it; when
stderr is not a terminal (CI, a log file) the progress is logged every `plain_interval_s`.
Role lines at INFO or DEBUG go only to the role's log file unless the job runs at DEBUG;
warnings, errors and anything that is not a log line (a traceback) are shown.
"""

import logging
import re
import sys
import threading
import time

_ROLE_LOG_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


class Console:
    """Serialises role lines, the master's logs and the progress line on one stream."""

    def __init__(self, stream=None, show_role_info=False, plain_interval_s=10.0):
        self._stream = stream or sys.stderr
        self._tty = hasattr(self._stream, "isatty") and self._stream.isatty()
        self._show_role_info = show_role_info
        self._plain_interval_s = plain_interval_s
        self._lock = threading.Lock()
        self._status = ""
        self._last_plain = 0.0

    def _write_above(self, text):
        with self._lock:
            if self._tty and self._status:
                self._stream.write("\r\033[K")
            self._stream.write(text + "\n")
            if self._tty and self._status:
                self._stream.write(self._status)
            self._stream.flush()

    def role_line(self, role, line):
        match = _ROLE_LOG_LINE.match(line)
        if match and match.group(1) in ("DEBUG", "INFO") and not self._show_role_info:
            return
        self._write_above(f"[{role}] {line}")

    def log(self, text):
        self._write_above(text)

    def status(self, text):
        """Shows `text` as the progress line."""
        with self._lock:
            self._status = text
            if self._tty:
                self._stream.write("\r\033[K" + text)
                self._stream.flush()
                return
            now = time.monotonic()
            if now - self._last_plain < self._plain_interval_s:
                return
            self._last_plain = now
            self._stream.write(text + "\n")
            self._stream.flush()

    def close(self):
        with self._lock:
            if self._tty and self._status:
                self._stream.write("\r\033[K" + self._status + "\n")
                self._stream.flush()
            self._status = ""


class ConsoleHandler(logging.Handler):
    """Routes the master's own log records through a `Console`."""

    def __init__(self, console):
        super().__init__()
        self._console = console

    def emit(self, record):
        try:
            self._console.log(self.format(record))
        except Exception:  # noqa: BLE001 - a log line must never break the job
            self.handleError(record)
