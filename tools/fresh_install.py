"""Installs BatchPPO as a user does and trains with it: `pip install .` into a fresh venv of
the running Python's version, then `batchppo-train` on Pendulum for a few thousand steps.

The dependencies come from the package index as pip resolves pyproject.toml's ranges (the
newest releases they allow, not the locks' pins): what a user installing next to other
libraries gets. CI runs it on each supported version but the default (`.ci/run`), e.g.

    .venv-3.12/bin/python tools/fresh_install.py

The fresh venv is made from this interpreter's base Python, in a temporary directory that is
removed afterwards (about 3 GB); the source tree is copied first, so nothing is written into it.
Exits non-zero, saying which step failed, when the install or the run fails.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Left out of the copy: venvs, Bazel's output links, git's store, caches.
NOT_COPIED = ('.venv*', 'bazel-*', '.git', '__pycache__', '*.pyc', '*.egg-info', 'build', 'dist')
# Packages whose resolved versions are reported.
REPORTED = ('tensorflow', 'apache-beam', 'gymnasium', 'numpy', 'protobuf', 'gin-config')


class StepFailed(Exception):
    pass


def run_step(name, command, log, **kwargs):
    """Runs `command`, its output appended to `log`; raises StepFailed naming `name`."""
    print(f'fresh_install: {name} ...', flush=True)
    start = time.monotonic()
    with open(log, 'a') as out:
        out.write(f'\n$ {" ".join(command)}\n')
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False,
                                **kwargs)
    if result.returncode:
        with open(log) as out:
            tail = ''.join(out.readlines()[-25:])
        raise StepFailed(f"step '{name}' exited with {result.returncode}; the end of its log "
                         f'({log}):\n{tail}')
    print(f'fresh_install: {name}: done in {time.monotonic() - start:.0f} s', flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--steps', type=int, default=4096, help='training steps on Pendulum')
    parser.add_argument('--keep', action='store_true', help='keep the venv and the run')
    parser.add_argument('--source', default=ROOT, help='the source tree to install (copied)')
    args = parser.parse_args(argv)
    version = platform.python_version()
    base_python = getattr(sys, '_base_executable', sys.executable)
    work = tempfile.mkdtemp(prefix=f'batchppo-fresh-install-{version}-')
    log = os.path.join(work, 'fresh_install.log')
    venv, source = os.path.join(work, 'venv'), os.path.join(work, 'src')
    print(f'fresh_install: Python {version} ({base_python}); work in {work}', flush=True)
    try:
        shutil.copytree(args.source, source, ignore=shutil.ignore_patterns(*NOT_COPIED))
        run_step(f'create a venv (python{version[:4]} -m venv)',
                 [base_python, '-m', 'venv', venv], log)
        python = os.path.join(venv, 'bin', 'python')
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(('PYTHON', 'BATCHPPO_', 'PIP_CONSTRAINT'))}
        run_step('pip install .', [python, '-m', 'pip', 'install', '--disable-pip-version-check',
                                   '--no-input', '.'], log, cwd=source, env=environment)
        versions = subprocess.run(
            [python, '-c', 'import importlib.metadata as m, json, sys; print(json.dumps('
             '{n: m.version(n) for n in sys.argv[1:]}))', *REPORTED],
            capture_output=True, text=True, check=True).stdout
        print(f'fresh_install: resolved {json.loads(versions)}', flush=True)
        logdir = os.path.join(work, 'pendulum')
        # From an empty directory: the config comes from the installed package.
        run_dir = os.path.join(work, 'cwd')
        os.makedirs(run_dir)
        run_step(f'batchppo-train on Pendulum for {args.steps} steps', [
            os.path.join(venv, 'bin', 'batchppo-train'), '--gin_file=configs/pendulum.gin',
            f'--gin_bindings=train.total_steps = {args.steps}', f'--logdir={logdir}'],
            log, cwd=run_dir, env=dict(environment, CUDA_VISIBLE_DEVICES=''))
        with open(log) as out:
            text = out.read()
        if f'(Python {version})' not in text:
            raise StepFailed(f'batchppo-train did not say it ran on Python {version} ({log})')
        with open(os.path.join(logdir, 'metrics.jsonl')) as lines:
            steps = max(json.loads(line).get('step', 0) for line in lines if line.strip())
        if steps < args.steps:
            raise StepFailed(f'the run stopped at step {steps} of {args.steps} ({logdir})')
        print(f'fresh_install: Python {version}: pip install . and batchppo-train passed '
              f'({steps} steps)', flush=True)
        return 0
    except (StepFailed, OSError, subprocess.CalledProcessError) as error:
        print(f'fresh_install: Python {version}: FAILED: {error}', file=sys.stderr, flush=True)
        args.keep = True  # Left for inspection.
        return 1
    finally:
        if args.keep:
            print(f'fresh_install: kept {work}', flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
