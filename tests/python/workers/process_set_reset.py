"""Worker for tests/python/test_torch.py: process sets across an elastic reset. Four
ranks (rank 3 on 127.0.0.3) register {0, 1} and {0, 1, 3}; the worker on 127.0.0.3 is
SIGKILLed mid-training, and the three survivors go on in a new epoch. There the sets are
still registered with their ranks: {0, 1} works, and {0, 1, 3} names a rank the epoch has
not got, a ValueError on every rank rather than a hang. Prints "process_set_reset: OK <n>
checks"."""
import os
import signal
import time

import torch

import elasticrun.torch as hvd
from checklib import check, finish, raises

hvd.init()
pair = hvd.add_process_set([0, 1])
trio = hvd.add_process_set([0, 1, 3])
check(hvd.size() == 4, f"started with {hvd.size()} ranks")
if trio.included():
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=trio)
    check(torch.equal(got, torch.full((2,), 3.0)), f"the set of 3 before the reset: {got}")
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    while state.step < 30:
        if state.step == 5 and hvd.size() == 4 and os.environ.get("ELASTICRUN_HOST") == "127.0.0.3":
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(torch.ones(1), op=hvd.Sum)
        state.step += 1
        state.commit()
        time.sleep(0.01)


train(state)
check(hvd.size() == 3, f"after the reset: {hvd.size()} ranks")
raises(ValueError, lambda: hvd.allreduce(torch.ones(2), process_set=trio), "a set naming a rank that is gone",
       "names ranks this epoch has not got")
if hvd.rank() < 2:
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=pair)
    check(torch.equal(got, torch.full((2,), 2.0)), f"the set of 2 after the reset: {got}")
check(pair.included() == (hvd.rank() < 2) and pair.size() == 2, "the set of 2 still knows its members")
hvd.shutdown()
finish("process_set_reset")
