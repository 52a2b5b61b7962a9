"""Helpers the tensor-parallel tests hand to spawned ranks (importable by name in a child process)."""

import os
import signal

DIE_AT_CONTEXT = 16


def dying_runners(cfg, phase, batch, context, *, tp=None, **kw):
    """``kernels.runners.make_runners``, except that rank 1 kills itself (SIGKILL, as an OOM killer or a
    crashed driver would) when it starts timing the point at ``DIE_AT_CONTEXT``."""
    from kernels.runners import make_runners

    runners = make_runners(cfg, phase, batch, context, tp=tp, **kw)
    if tp is not None and tp.rank == 1 and context == DIE_AT_CONTEXT:
        runners[0].fn = lambda: os.kill(os.getpid(), signal.SIGKILL)
    return runners
