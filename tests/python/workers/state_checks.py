"""Worker for tests/python/test_state_holders.py: an elastic state's sync takes rank 0's
commit count only once everything has arrived. Run with --checkpoint-dir (the durable
agreement before the broadcast is where the count used to change). Prints
`state_checks: OK <n> checks`."""
import numpy as np

import elasticrun as er
from elasticrun import elastic
from checklib import check, finish


def failing_broadcast(obj):
    raise er.WorkersFailedError("injected: the sync's broadcast failed")


def main():
    er.init()
    r = er.rank()
    own = 7 if r == 0 else 3
    # Every rank's object broadcast fails (a peer died in it): the run loop restores this
    # rank's own commit, so the count must stay this rank's own.
    s = elastic.ObjectState(bcast_object=failing_broadcast, x=np.full(4, r))
    s._commits = own  # the library's count, as if this rank had committed that often
    try:
        s.sync()
        check(False, "a sync whose broadcast failed raised nothing")
    except er.WorkersFailedError:
        pass
    s.restore()
    check(s.commits == own, f"commits after a failed sync: {s.commits}, want this rank's own {own}")
    check((s.x == r).all(), f"x after a failed sync and restore: {s.x}")
    # A sync that completes gives every rank rank 0's state and commit count.
    s = elastic.ObjectState(x=np.full(4, r))
    s._commits = own  # the library's count, as if this rank had committed that often
    s.sync()
    check(s.commits == 7, f"commits after a sync: {s.commits}, want rank 0's 7")
    check((s.x == 0).all(), f"x after a sync: {s.x}")
    er.shutdown()
    finish("state_checks")


if __name__ == "__main__":
    main()
