r"""A full or read-only disk under a training run, inside a private mount namespace.

    unshare --user --map-root-user --mount python -m reliability.disk_faults SPEC.json

The test (disk_test.py) runs this in a mount namespace of its own, where it may mount without
touching the machine: a tmpfs at `mount` holds the logdir (`<mount>/run`). The trainer runs
until its first complete save; then the fault strikes:

    'enospc'    a filler file takes every free byte of the tmpfs: writes fail with ENOSPC;
    'readonly'  the checkpoint directory is bind-mounted read-only: writes fail with EROFS
                (the whole logdir cannot be remounted read-only while the trainer holds files in
                it open for writing, which is what the kernel refuses, not what users see).

The trainer must stop with a clear error. The logdir is copied to `<outdir>/after_fault`; the
fault is lifted and the same command rerun, which must resume and finish; the logdir is copied
to `<outdir>/after_rerun`. `<outdir>/result.json` gets both exit codes and outputs. Nothing
outlives the namespace: the tmpfs vanishes with it.
"""

import json
import os
import shutil
import subprocess
import sys

from reliability import harness

FAULTS = ('enospc', 'readonly')


def _mount(*args):
    subprocess.run(['mount', *args], check=True, capture_output=True, text=True)


def _fill(directory):
    """Writes a file in `directory` until the file system is full."""
    block = b'\0' * (1 << 20)
    with open(os.path.join(directory, 'filler'), 'wb', buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        block = b'\0' * 1024
        try:
            while True:
                f.write(block)
        except OSError:
            pass


def run(spec):
    fault, mount, outdir = spec['fault'], spec['mount'], spec['outdir']
    if fault not in FAULTS:
        raise ValueError(f'fault must be one of {FAULTS}, got {fault!r}')
    _mount('-t', 'tmpfs', '-o', f'size={spec.get("size", "64m")}', 'tmpfs', mount)
    logdir = os.path.join(mount, 'run')
    flags = [*spec['train_flags'], f'--logdir={logdir}']
    checkpoints = harness.checkpoint_dir(logdir)
    result = {}
    with harness.Binary('train', *flags, log_path=os.path.join(outdir, 'fault.log')) as trainer:
        # The first save is complete when its metrics line is there.
        harness.wait_for(lambda: harness.metrics(logdir), 300, 'the first save',
                         process=trainer)
        result['checkpoint_before'] = harness.checkpoint_state(logdir)[1]
        if fault == 'enospc':
            _fill(mount)
        else:
            _mount('--bind', checkpoints, checkpoints)
            _mount('-o', 'remount,ro,bind', checkpoints)
        result['fault_returncode'] = trainer.wait(300)
        result['fault_output'] = trainer.output()
    shutil.copytree(logdir, os.path.join(outdir, 'after_fault'), symlinks=True)
    if fault == 'enospc':
        os.remove(os.path.join(mount, 'filler'))
    else:
        subprocess.run(['umount', checkpoints], check=True)
    rerun = harness.run('train', *flags, timeout=600)
    result['rerun_returncode'] = rerun.returncode
    result['rerun_output'] = rerun.stderr
    shutil.copytree(logdir, os.path.join(outdir, 'after_rerun'), symlinks=True)
    with open(os.path.join(outdir, 'result.json'), 'w', encoding='utf-8') as f:
        json.dump(result, f)


def main(argv):
    with open(argv[1], encoding='utf-8') as f:
        run(json.load(f))


if __name__ == '__main__':
    main(sys.argv)
