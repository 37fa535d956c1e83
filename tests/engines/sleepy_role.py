"""A role for engine tests: `python -m tests.engines.sleepy_role SECONDS EXIT_CODE [FLAG
VALUE]...` prints 'up', its pid and its command line, then each FLAG=VALUE (for --secret-file,
the private data VALUE names; for --env, the value of the environment variable VALUE), sleeps,
and exits with EXIT_CODE; it prints 'bye' on SIGTERM and exits 0 then."""

import os
import signal
import sys
import time

from elastic_keras.common.private_data import read_private


def main():
    seconds, code = float(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: (print("bye", flush=True), sys.exit(0)))
    print("up", flush=True)
    print(f"pid {os.getpid()}", flush=True)
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        argv = f.read().replace(b"\0", b" ").replace(b"\n", b" ")
    print("argv " + argv.decode(errors="replace"), flush=True)
    extra = sys.argv[3:]
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag == "--secret-file":
            value = read_private(value, flag).decode()
        elif flag == "--env":
            value = os.environ.get(value, "")
        print(f"{flag}={value}", flush=True)
    time.sleep(seconds)
    sys.exit(code)


if __name__ == "__main__":
    main()
