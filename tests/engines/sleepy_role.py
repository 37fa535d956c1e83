"""A role for engine tests: `python -m tests.engines.sleepy_role SECONDS EXIT_CODE [FLAG
VALUE]...` prints 'up' and its pid, then each FLAG=VALUE (for --secret-file, the private data
VALUE names), sleeps, and exits with EXIT_CODE; it prints 'bye' on SIGTERM and exits 0 then."""

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
    extra = sys.argv[3:]
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag == "--secret-file":
            value = read_private(value, flag).decode()
        print(f"{flag}={value}", flush=True)
    time.sleep(seconds)
    sys.exit(code)


if __name__ == "__main__":
    main()
