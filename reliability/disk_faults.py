r"""A full disk, then a read-only one, under a training run, inside a private mount namespace.

    unshare --user --map-root-user --mount python -m reliability.disk_faults SPEC.json

The test (disk_test.py) runs this in a mount namespace of its own, where it may mount without
touching the machine: a tmpfs at `mount` holds the logdir (`<mount>/run`). The trainers run in
forks of this process (harness.start_module_forked), which imports TensorFlow once. One run
meets both faults, each after a complete save (its metrics line):

    ENOSPC  a filler file takes every free byte of the tmpfs;
    EROFS   (the filler removed, the same command resumed) the checkpoint directory is
            bind-mounted read-only (the whole logdir cannot be remounted read-only while the
            trainer holds files in it open for writing, which is what the kernel refuses, not
            what users see).

Then the mount is lifted and the same command rerun, which must resume and finish. The logdir
after each run is copied to `<outdir>/after_enospc`, `<outdir>/after_readonly` and
`<outdir>/after_rerun`; `<outdir>/result.json` gets the exit codes and outputs. Nothing outlives
the namespace: the tmpfs vanishes with it.
"""

import json
import os
import shutil
import subprocess
import sys

from reliability import harness


def mount(*args):
    subprocess.run(['mount', *args], check=True, capture_output=True, text=True)


def fill(directory):
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


def _stopped_by(fault, logdir, flags, strike):
    """Starts the trainer; once it has saved an evaluation past those `logdir` holds, calls
    `strike()` and waits for its end: the fields of `fault` in a dict."""
    done = [record['step'] for record in harness.metrics(logdir)]
    trainer = harness.start_module_forked('agents.scripts.train', *flags, cwd=harness.ROOT)
    try:
        harness.wait_for(
            lambda: trainer.poll() is not None or any(record['step'] > max(done, default=0)
                                           for record in harness.metrics(logdir)),
            300, f'a save before the {fault} fault')
        result = {f'{fault}_before': harness.checkpoint_state(logdir)[1]}
        strike()
        process = trainer.wait(300)
    finally:
        trainer.kill()
    result[f'{fault}_returncode'] = process.returncode
    result[f'{fault}_output'] = process.stdout + process.stderr
    return result


def main(spec_path):
    """The faults and reruns the module's docstring tells, as SPEC.json describes them."""
    with open(spec_path, encoding='utf-8') as f:
        spec = json.load(f)
    harness.preload(pipelines=False)
    tmpfs, outdir = spec['mount'], spec['outdir']
    mount('-t', 'tmpfs', '-o', f'size={spec["size"]}', 'tmpfs', tmpfs)
    logdir = os.path.join(tmpfs, 'run')
    flags = [*spec['train_flags'], f'--logdir={logdir}']
    checkpoints = harness.checkpoint_dir(logdir)

    def read_only():
        mount('--bind', checkpoints, checkpoints)
        mount('-o', 'remount,ro,bind', checkpoints)

    result = _stopped_by('enospc', logdir, flags, lambda: fill(tmpfs))
    shutil.copytree(logdir, os.path.join(outdir, 'after_enospc'), symlinks=True)
    os.remove(os.path.join(tmpfs, 'filler'))
    result.update(_stopped_by('readonly', logdir, flags, read_only))
    shutil.copytree(logdir, os.path.join(outdir, 'after_readonly'), symlinks=True)
    subprocess.run(['umount', checkpoints], check=True)
    rerun = harness.run_module_forked('agents.scripts.train', *flags, timeout=600,
                                      cwd=harness.ROOT)
    result['rerun_returncode'] = rerun.returncode
    result['rerun_output'] = rerun.stderr
    shutil.copytree(logdir, os.path.join(outdir, 'after_rerun'), symlinks=True)
    with open(os.path.join(outdir, 'result.json'), 'w', encoding='utf-8') as f:
        json.dump(result, f)


if __name__ == '__main__':
    main(sys.argv[1])
