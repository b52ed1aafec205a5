"""Worker for tests/python/test_sweep_api.py: reports every step until told to stop.

    report_worker.py MAX_STEPS

Each step queues an asynchronous allreduce first (report must run after it, in issue
order), then calls elasticrun.report(step, loss=..., rank=...) with a numpy scalar and
an int among the metrics. Every rank prints `rank R step S -> stop|continue` per report,
then `rank R ended at step S should_stop=B`, and its elasticrun.sweep view:
`rank R sweep config=... id=... dir=...`."""
import json
import sys

import numpy as np

import elasticrun as er
import elasticrun.torch as hvd
from elasticrun import sweep


def main():
    max_steps = int(sys.argv[1])
    er.init()
    rank = er.rank()
    print(f"rank {rank} sweep config={json.dumps(sweep.config(), sort_keys=True)} id={sweep.trial_id()} "
          f"dir={sweep.trial_dir()}", flush=True)
    assert hvd.report is er.report and hvd.should_stop is er.should_stop
    step = 0
    x = np.ones(1024, dtype=np.float32)
    while step < max_steps:
        step += 1
        h = er.allreduce_async(x, op=er.Sum, out=x)
        stop = er.report(step, loss=np.float64(1.0 / step), rank=rank)
        h.wait()
        print(f"rank {rank} step {step} -> {'stop' if stop else 'continue'}", flush=True)
        assert er.should_stop() == stop
        if stop:
            break
    print(f"rank {rank} ended at step {step} should_stop={er.should_stop()}", flush=True)
    er.shutdown()


if __name__ == "__main__":
    main()
