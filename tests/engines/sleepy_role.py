"""A role for engine tests: `python -m tests.engines.sleepy_role SECONDS EXIT_CODE` prints
'up', sleeps, and exits with EXIT_CODE; it prints 'bye' on SIGTERM and exits 0 then."""

import signal
import sys
import time


def main():
    seconds, code = float(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: (print("bye", flush=True), sys.exit(0)))
    print("up", flush=True)
    time.sleep(seconds)
    sys.exit(code)


if __name__ == "__main__":
    main()
