"""What a program learns when it runs as a trial of ``elasticrun sweep``: its
configuration, id and checkpoint directory, from the environment the sweep gives every
worker of the trial. Outside a sweep: ``{}`` and ``None``.

    import elasticrun as er
    from elasticrun import sweep
    lr = sweep.config().get("lr", 0.01)
    ...
    if er.report(epoch, loss=loss):   # the sweep's scheduler may stop the trial here
        break
"""
import json
import os

__all__ = ["config", "trial_id", "trial_dir"]

CONFIG_VAR = "ELASTICRUN_TRIAL_CONFIG"
ID_VAR = "ELASTICRUN_TRIAL_ID"
DIR_VAR = "ELASTICRUN_TRIAL_DIR"


def config():
    """The trial's configuration: ``json.loads`` of ELASTICRUN_TRIAL_CONFIG, ``{}`` when it
    is unset or empty. A value that is not JSON raises ValueError naming the variable."""
    text = os.environ.get(CONFIG_VAR, "")
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"{CONFIG_VAR} is not JSON: {e}") from None


def trial_id():
    """The trial's id (ELASTICRUN_TRIAL_ID), or None outside a sweep."""
    return os.environ.get(ID_VAR) or None


def trial_dir():
    """The trial's own directory for checkpoints (ELASTICRUN_TRIAL_DIR), or None outside
    a sweep. A new run of the trial (after the sweep was resumed, or a PBT exploit) finds
    there what the last one left."""
    return os.environ.get(DIR_VAR) or None
