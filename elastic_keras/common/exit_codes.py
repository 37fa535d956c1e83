"""The exit codes of the roles' processes, read by the master to say why a role stopped.

A role exits with one of these on its own; any other positive code is a crash (an uncaught
exception exits 1 as well, so MASTER_LOST has its own number), and a negative one is the
signal that killed it.
"""

import enum


class RoleExitCode(enum.IntEnum):
    OK = 0
    BAD_INPUT = 2  # a flag, checkpoint or model module the role cannot use
    LEAVE_TIMEOUT = 3  # a worker asked to leave could not hand its task back in time
    MASTER_LOST = 4  # the master did not answer for MASTER_LOST_S: no orphan outlives a job
