"""A short chaos soak (scripts/chaos): random SIGKILLs and SIGSTOPs of workers, killed
daemons, the loss of every worker at once, a flapping discovery file and rank 0 killed in
a new epoch's reset window (sync0), then the script's own checks (exit 0, the reference
model for the steps done, committed steps kept, no hang, nothing left behind); and the
commit check itself, on made-up runs, failing where a commit goes back. The long soaks'
figures are in tests/RESULTS.md."""
import importlib.machinery
import importlib.util
import re
import subprocess

from conftest import BUILD, ROOT

KINDS = ("sigkill", "sigstop", "daemon", "total", "flap", "sync0")


def test_short_chaos_soak_keeps_every_guarantee(tmp_path):
    r = subprocess.run([str(ROOT / "scripts" / "chaos"), "--faults", "25", "--seed", "9", "--build", str(BUILD),
                        "--keep", str(tmp_path / "run")], capture_output=True, text=True, timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "FAILED" not in out, out[-4000:]
    assert len(re.findall(r"^chaos: ok ", out, re.M)) == 6, out[-4000:]
    counts = dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", out.split("chaos: faults: ")[1].splitlines()[0]))
    assert sum(counts[k] for k in KINDS) == 25, counts
    for kind in KINDS:  # the seed strikes each kind
        assert counts[kind] >= 1, (kind, counts)
    assert re.search(r"from a checkpoint [1-9]", out), out[-2000:]
    assert re.search(r"^chaos: sync0: [1-9]\d* rank 0s killed in their reset window, [1-9]", out, re.M), out[-2000:]


def chaos_module():
    loader = importlib.machinery.SourceFileLoader("chaos", str(ROOT / "scripts" / "chaos"))
    spec = importlib.util.spec_from_loader("chaos", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run_of(reports, events):
    """A made-up run: rank 0's commit reports as (step, epoch) and the events."""
    out = "\n".join(f"[0]<stdout>: committed step {s} size 2 epoch {e}" for s, e in reports) + "\n"
    return out, events


def started(epoch):
    return {"event": "epoch_started", "epoch": epoch}


def saved(commit, epoch):
    return {"event": "checkpoint_saved", "commit": commit, "epoch": epoch}


def restored(commit, epoch):
    return {"event": "checkpoint_restored", "commit": commit, "epoch": epoch}


def reset(from_checkpoint):
    return {"event": "reset", "from_checkpoint": from_checkpoint}


def synced(epoch):
    return {"event": "state_synced", "epoch": epoch, "host": "h", "slot": 0}


# A total loss at step 30 (epoch 2) with commit 4 (step 20) the newest checkpoint: epoch 3
# restores it and trains on from step 25.
LOSS = ([(5, 1), (10, 1), (15, 2), (20, 2), (25, 2), (30, 2), (25, 3), (30, 3), (35, 3)],
        [started(1), synced(1), saved(2, 1), reset(False), started(2), synced(2), saved(4, 2), reset(True),
         started(3), restored(4, 3), synced(3)])


def test_commit_check_passes_a_loss_back_to_the_newest_checkpoint():
    chaos = chaos_module()
    problems, summary = chaos.check_commits(*run_of(*LOSS), 5, 35)
    assert not problems, problems
    assert "1 restores from checkpoints, 10 steps trained again" in summary, summary


def test_commit_check_fails_where_a_commit_goes_back():
    chaos = chaos_module()
    reports, events = LOSS

    def problems(reports=reports, events=events, stopped=35):
        return chaos.check_commits(*run_of(reports, events), 5, stopped)[0]

    # A step lost in an epoch change without any restore (the restore taken away).
    no_restore = [e for e in events if e["event"] != "checkpoint_restored"]
    assert any("with no restore" in p for p in problems(events=no_restore)), problems(events=no_restore)
    # Back further than the restored checkpoint.
    below = reports[:6] + [(20, 3), (25, 3), (30, 3), (35, 3)]
    assert any("before the commit after the restored checkpoint" in p for p in problems(reports=below))
    # A restore of an older checkpoint than the newest saved.
    older = events[:-2] + [restored(2, 3), synced(3)]
    assert any("older than the newest checkpoint" in p for p in problems(events=older))
    # A restore that no total loss called for.
    needless = [reset(False) if e == reset(True) else e for e in events]
    assert any("without a total loss" in p for p in problems(events=needless))
    # A step committed twice in one epoch, an epoch going back, a stop not reported.
    assert any("in epoch 2" in p for p in problems(reports=reports[:5] + [(25, 2)] + reports[6:]))
    assert any("went back from epoch 3 to 2" in p for p in problems(reports=reports + [(40, 2)], stopped=40))
    assert any("stopped at step 40" in p for p in problems(stopped=40))


def test_commit_check_ends_a_loss_after_the_last_report_at_the_restored_step():
    """Every holder lost after the soak: the restoring epoch reports the restored commit
    (no stdout line: it trained no step) and is told to stop there."""
    chaos = chaos_module()
    reports, events = LOSS
    events = events + [saved(6, 3), reset(True), started(4), restored(6, 4), synced(4)]
    problems, summary = chaos.check_commits(*run_of(reports, events), 5, 30)
    assert not problems, problems
    assert "15 steps trained again" in summary, summary
    problems, _ = chaos.check_commits(*run_of(reports, events), 5, 35)
    assert any("not where its lineage ends: step 30" in p for p in problems), problems
