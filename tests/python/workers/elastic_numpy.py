"""Worker for tests/python/test_elastic.py: elastic_sgd's idea in Python, on
elasticrun.elastic.ObjectState and @elastic.run. The model is int64 and the gradient of a
step is a sum of per-sample integer terms, so any split of the batch across any number
of ranks gives the same bits, and a run that lost, gained or replaced workers must end
with exactly the reference's model.

    elastic_numpy.py STEPS [--reference] [--fail-at STEP] [--step-ms MS] [--busy-at STEP --busy-seconds S]
                     [--reset-ms MS]

Tracked state: w, step, begun (steps started, advanced before the allreduce, so a
restore that did nothing shows), commit_log (committed step numbers of the lineage).
Rank 0 prints `committed step N size S epoch E` after each commit; every rank prints
`final ...` at the end."""
import argparse
import os
import sys
import time

import numpy as np

DIM, BATCH, COMMIT_EVERY = 32, 24, 5


def sample_terms(step, i):
    """Integer gradient contribution of sample i of a step (a pure function)."""
    rng = np.random.default_rng([step, i])
    return rng.integers(-1000, 1000, size=DIM, dtype=np.int64)


def local_gradient(step, rank, size):
    g = np.zeros(DIM, dtype=np.int64)
    for i in range(rank, BATCH, size):
        g += sample_terms(step, i)
    return g


def final_line(w, step, begun, log):
    return "final step=%d begun=%d commits=%d commit_sum=%d w=%d" % (step, begun, len(log), sum(log),
                                                                     int((w * np.arange(1, DIM + 1)).sum()))


def reference(steps):
    w, log = np.zeros(DIM, dtype=np.int64), []
    for step in range(steps):
        w -= local_gradient(step, 0, 1) // 7
        if (step + 1) % COMMIT_EVERY == 0 or step + 1 == steps:
            log.append(step + 1)
    return final_line(w, steps, steps, log)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--fail-at", type=int, default=-1, help="rank 1 of epoch 1 exits hard at this step")
    p.add_argument("--step-ms", type=float, default=0)
    p.add_argument("--busy-at", type=int, default=-1,
                   help="rank 1 of epoch 1 computes in Python, holding the GIL, at this step")
    p.add_argument("--busy-seconds", type=float, default=0)
    p.add_argument("--reset-ms", type=float, default=0,
                   help="rank 0 of a new epoch waits this long in its reset callback, before the sync")
    o = p.parse_args()
    if o.reference:
        print(reference(o.steps))
        return

    import elasticrun as er
    from elasticrun import _core, elastic

    er.init()
    state = elastic.ObjectState(w=np.zeros(DIM, dtype=np.int64), step=0, begun=0, commit_log=[])
    def on_reset():
        print("reset: size %d rank %d" % (er.size(), er.rank()), flush=True)
        if er.rank() == 0 and o.reset_ms:
            time.sleep(o.reset_ms / 1000)  # the newcomers wait in the sync meanwhile

    state.register_reset_callbacks([on_reset])

    @elastic.run
    def train(state):
        while state.step < o.steps:
            if state.step == o.fail_at and er.rank() == 1 and _core.epoch() == 1:
                print("injected failure at step %d" % state.step, file=sys.stderr, flush=True)
                os._exit(1)
            if o.step_ms:
                time.sleep(o.step_ms / 1000)
            if state.step == o.busy_at and er.rank() == 1 and _core.epoch() == 1:
                until, spins = time.monotonic() + o.busy_seconds, 0
                while time.monotonic() < until:
                    spins += 1
                print("busy for %.1f s at step %d" % (o.busy_seconds, state.step), flush=True)
            state.begun += 1  # before the collective: a missing rollback shows in the final line
            g = local_gradient(state.step, er.rank(), er.size())
            er.allreduce(g, op=er.Sum, out=g)
            state.w -= g // 7  # in place: the snapshot must not alias it
            state.step += 1
            if state.step % COMMIT_EVERY == 0 or state.step == o.steps:
                state.commit_log.append(state.step)
                try:
                    state.commit()
                finally:
                    if er.rank() == 0:
                        print("committed step %d size %d epoch %d" % (state.step, er.size(), _core.epoch()),
                              flush=True)

    train(state)
    print(final_line(state.w, state.step, state.begun, state.commit_log), flush=True)
    er.shutdown()


if __name__ == "__main__":
    main()
