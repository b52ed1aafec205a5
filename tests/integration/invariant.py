"""The elastic invariant's progress half, shared by the suites that run elastic jobs
(tests/integration and tests/python): rank 0's commit reports never go backwards and
reach the end. Kept apart from any conftest so that both suites can import it."""
import re

COMMITTED = re.compile(r"^\[\d+\]<stdout>: committed step (\d+) size (\d+) epoch (\d+)$", re.M)


def check_commits(out, steps, min_epoch=1):
    """Rank 0's commit reports in the driver's output (elastic_sgd's 'committed step N size S
    epoch E', printed by rank 0 of the epoch only) never go backwards, and the job got where
    the test sent it. Returns the reports as (step, size, epoch) tuples.

    The final line cannot see lost progress: a job that threw its state away at a reset and
    started over from step 0 ends with the reference model too. These reports can. In the
    order the driver printed them, for each report after the first:
    - its epoch is never lower than the previous report's;
    - in the same epoch its step is higher: one rank 0 commits each step once, in order;
    - after a change of epoch its step is at least the previous one. Equal is legal: rank 0
      can report step N and then die, or leave the epoch at that commit (hosts updated),
      while another rank's commit of N was cut short; that rank restores N - commit_every,
      and as the next epoch's rank 0 it trains and reports N again. Lower never is: rank 0
      reports N after its commit of N completed, when every rank had taken the snapshot of
      N, or after leaving at that commit (hosts updated, or its closing allreduce failed
      because a peer died), when every rank had at least completed the commit before it
      (step N's allreduce needed them all); no rank is rolled back further, so the next
      epoch's first commit is of N or later.
    Then the last report is of step `steps` (the job trained to the end), and in epoch
    `min_epoch` or later: the resets the test caused happened, and rank 0 committed after
    them. The assertion messages show the whole sequence."""
    seq = [tuple(map(int, m)) for m in COMMITTED.findall(out)]
    shown = " ".join(f"{s}@e{e}" for s, _, e in seq)
    assert seq, "rank 0 reported no commit:\n" + out[-3000:]
    for (s0, _, e0), (s1, _, e1) in zip(seq, seq[1:]):
        assert e1 >= e0, f"rank 0's commits went back from epoch {e0} to {e1} (step@epoch): {shown}"
        if e1 == e0:
            assert s1 > s0, f"rank 0 committed step {s1} after {s0} in epoch {e0} (step@epoch): {shown}"
        else:
            assert s1 >= s0, (f"training went back from step {s0} (epoch {e0}) to {s1} (epoch {e1}): progress "
                              f"was lost at a reset (step@epoch): {shown}")
    assert seq[-1][0] == steps, f"the last commit is not of step {steps} (step@epoch): {shown}"
    assert seq[-1][2] >= min_epoch, f"rank 0's last commit is before epoch {min_epoch} (step@epoch): {shown}"
    return seq
