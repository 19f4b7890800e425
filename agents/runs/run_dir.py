"""What the files of a run directory and of a sweep directory are called, and where they lie.

Every writer and reader of these directories takes the names from here, so a name is spelled
once. Storing the files, locally or behind a URL, is agents/storage's job.

A run directory holds:

    config.gin             the configuration the run was started with (a rerun must match it)
    operative_config.gin   every parameter the run used
    metrics.jsonl          a line per evaluation: step, mean_return, ...
    events.out.tfevents.*  TensorBoard summaries
    metrics.orphaned.jsonl evaluations past the checkpoint a resumed run restored (recovery.py)
    checkpoints/           the latest checkpoints: ckpt-<step>.*, and corrupt/ for broken ones
    policy/<step>/         the exported policy (SavedModel) of each kept checkpoint
    train.log, result.json a sweep trial's trainer output and its result (written last)

A population's directory holds population.gin and its members' runs, member-<k>/.

A sweep directory (pipelines/sweep/) holds:

    sweep_spec.yaml        the spec the sweep was started with (a rerun must match it)
    trials.jsonl           a line per trial: its id, status, seed, bindings and result
    summary.csv            the same, a row per trial
    rungs.jsonl            a successive-halving sweep's decisions, a line per rung
    search.db              the Optuna study of a sweep with `search`
    trials/<id>/           each trial's run directory
    populations/<id>/      the run directories of trials trained together as one population
"""

import os
import re

# --- A run directory ------------------------------------------------------------------------
CONFIG_FILE = 'config.gin'
OPERATIVE_CONFIG_FILE = 'operative_config.gin'
# A population's logdir (`train.population`) holds its configuration here, next to the runs of
# its members (`member-<k>/`), and no run file of its own: tools that look for runs find those.
POPULATION_CONFIG_FILE = 'population.gin'
MEMBER_DIR = 'member-{}'
METRICS_FILE = 'metrics.jsonl'
ORPHANED_METRICS_FILE = 'metrics.orphaned.jsonl'
CHECKPOINT_DIR = 'checkpoints'
CHECKPOINT_PREFIX = 'ckpt'  # tf.train.CheckpointManager's: checkpoints/ckpt-<step>.index, ...
CORRUPT_DIR = 'corrupt'  # In CHECKPOINT_DIR: checkpoints that did not read back.
POLICY_DIR = 'policy'
LOG_FILE = 'train.log'
RESULT_FILE = 'result.json'
LOCK_FILE = '.lock'  # A local run's flock (run_config.LogdirLock).
LEASE_FILE = '.lease'  # A remote run's lease object (lease.py).
# In a bucket run's local staging directory (remote_logdir.py): the run's local copy, the
# frozen saves waiting for upload, and the record of what the bucket holds.
STAGING_RUN_DIR = 'run'
STAGING_PENDING_DIR = 'pending'
STAGING_UPLOADED_FILE = 'uploaded.json'
EVENTS_PREFIX = 'events.out.tfevents.'
# Files a sweep's trial writes beside the trainer's: the trainer leaves them alone.
TRIAL_FILES = (LOG_FILE, RESULT_FILE)

# --- A sweep directory ----------------------------------------------------------------------
SPEC_COPY = 'sweep_spec.yaml'
TRIALS_FILE = 'trials.jsonl'
SUMMARY_FILE = 'summary.csv'
RUNGS_FILE = 'rungs.jsonl'
STUDY_FILE = 'search.db'
TRIALS_DIR = 'trials'
POPULATIONS_DIR = 'populations'

# --- The bindings a sweep sets for its trials -----------------------------------------------
SEED_BINDING = 'train.seed'
# The bindings that make a population, which its members' configurations do not have.
POPULATION_BINDINGS = ('train.population', 'train.population_members')


def exported_steps(policy_dir):
    """Steps of the policies exported under a local `policy_dir` (named by step), ascending."""
    if not os.path.isdir(policy_dir):
        return []
    return sorted(int(name) for name in os.listdir(policy_dir)
                  if re.fullmatch(r'\d+', name) and os.path.isdir(os.path.join(policy_dir, name)))


_CHECKPOINT_INDEX = re.compile(rf'{CHECKPOINT_PREFIX}-(\d+)\.index')


def checkpoint_index_step(name):
    """The step of a checkpoint's index file named `name` (`ckpt-<step>.index`), else None."""
    match = _CHECKPOINT_INDEX.fullmatch(name)
    return int(match.group(1)) if match else None
