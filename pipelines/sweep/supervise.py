"""Runs a command and takes its whole process group down when the caller dies.

    python -m pipelines.sweep.supervise CALLER_PID COMMAND [ARGS...]

Started as the leader of a new process group (trial.py uses `start_new_session`), this process
asks Linux for SIGTERM when its parent thread ends (PR_SET_PDEATHSIG), runs COMMAND in the
same group and, on that signal, kills the group: the command and whatever it started, such as
environment worker processes. So a sweep worker that is killed leaves no training behind. The
exit status is the command's: the same code, or death by the same signal. CALLER_PID catches a
caller that died before the request took effect. Only the standard library is imported: this
starts once per trial.
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def main(argv):
    if len(argv) < 3:
        sys.exit('usage: python -m pipelines.sweep.supervise CALLER_PID COMMAND [ARGS...]')
    caller, command = int(argv[1]), argv[2:]
    if os.getpgrp() != os.getpid():
        sys.exit('supervise: must lead its process group (start it in a new session)')
    signal.signal(signal.SIGTERM, _kill_group)
    if sys.platform.startswith('linux'):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != caller:
        _kill_group()
    # close_fds=False: the command inherits the caller's lock on the trial's logdir.
    returncode = subprocess.Popen(command, close_fds=False).wait()
    if returncode < 0:
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


def _kill_group(*unused_signal_and_frame):
    os.killpg(0, signal.SIGKILL)


if __name__ == '__main__':
    main(sys.argv)
