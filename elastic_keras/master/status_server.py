"""The master's status page: HTTP on 127.0.0.1 only, read-only, for the person running the
job (on a cluster: through a port forward).

- `/`: the page (`status_page.html`, self-contained: it loads nothing from elsewhere and
  redraws itself from `/status.json` every two seconds);
- `/status.json`: `StatusView.snapshot()`;
- `/metrics`: the same in the Prometheus text format (`status_metrics`).

A request whose `Host` names anything but the loopback (127.0.0.1, localhost, [::1], any
port) is refused with 403: a web page elsewhere cannot rebind its own name to 127.0.0.1 and
read the job's status from the user's browser.
"""

import http.server
import json
import logging
import pathlib
import re
import threading

from elastic_keras.master import status_metrics

logger = logging.getLogger(__name__)

PAGE = pathlib.Path(__file__).with_name("status_page.html")
HOST = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def start_status_page(view, config):
    """The `StatusServer` of a job (`config`: its `JobConfig`), or None with
    `--no-status-page` or when its port cannot be bound (logged: the job goes on)."""
    if not config.status_page:
        return None
    try:
        page = StatusServer(view, config.status_port)
    except OSError as exc:
        logger.warning("No status page: cannot serve on %s:%d (%s)", HOST, config.status_port,
                       exc)
        return None
    logger.info("Status page: %s (metrics: %smetrics)", page.url, page.url)
    return page


class StatusServer:
    """Serves `view` (a `StatusView`) on 127.0.0.1:`port` (0: a free port) in a thread.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, view, port=0):
        handler = type("Handler", (_Handler,), {"view": view, "page": PAGE.read_bytes()})
        self._server = http.server.ThreadingHTTPServer((HOST, port), handler)
        self._server.daemon_threads = True
        self.url = f"http://{HOST}:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="status-page", daemon=True)
        self._thread.start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    view = None
    page = b""

    def do_GET(self):  # noqa: N802 - the http.server name
        path = self.path.split("?", 1)[0]
        host = self.headers.get("Host")
        if host is not None and _hostname(host) not in LOOPBACK_NAMES:
            self._send(403, "text/plain", "The status page answers requests for 127.0.0.1, "
                       f"localhost or [::1] only. Received: Host {host[:100]!r}\n".encode())
            return
        try:
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", self.page)
            elif path == "/status.json":
                self._send(200, "application/json",
                           json.dumps(self.view.snapshot()).encode())
            elif path == "/metrics":
                self._send(200, status_metrics.CONTENT_TYPE,
                           status_metrics.render(self.view.snapshot()).encode())
            else:
                self._send(404, "text/plain", f"No page {path[:100]!r}: try /, "
                           "/status.json or /metrics\n".encode())
        except Exception as exc:  # noqa: BLE001 - a view that fails must not stop the job
            logger.warning("The status page could not answer %s: %s", path[:100], exc)
            self._send(500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode())

    def _send(self, code, content_type, body):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - quiet: one line per request
        logger.debug("status page: " + format, *args)


def _hostname(host):
    """The name of a `Host` header without its port, lower-cased; "" if it is not a name
    with an optional port."""
    match = _HOST.fullmatch(host.strip().lower())
    return match.group(1) if match else ""


_HOST = re.compile(r"(\[[0-9a-f:.]*\]|[^:\[\]]*)(?::\d+)?")
