"""What the benchmarks' tests share: the peers' python, the skip of a test that needs it, and a
gin file's bindings read as text.

Kept in one place so that the tests of the training, A2C and SAC benchmarks find .venv-peers, say
why they skip and read the configs the same way.
"""

import ast
import os
import re

from absl.testing import absltest

from agents.runs import run_config

# The python of .venv-peers (benchmarks/setup_peers.sh), where SB3 and rejax are installed.
PEERS_PYTHON = os.path.join(run_config.PACKAGE_ROOT, '.venv-peers', 'bin', 'python')


def needs_peers(peer):
    """Skips the decorated test unless PEERS_PYTHON exists, naming `peer` (e.g. 'SB3') as what
    cannot be checked without it."""
    return absltest.skipUnless(
        os.path.exists(PEERS_PYTHON), '.venv-peers is absent (build it with '
        f'benchmarks/setup_peers.sh) so {peer} cannot be checked')


def gin_file_bindings(path):
    """{'Configurable.parameter': value} of a gin file's plain bindings, parsed as text (a
    reference `@Name` gives 'Name')."""
    bindings = {}
    with open(path, encoding='utf-8') as f:
        for line in f:
            match = re.match(r'^(\w+\.\w+)\s*=\s*(.+?)\s*(#.*)?$', line)
            if match:
                text = match.group(2)
                bindings[match.group(1)] = (text[1:] if text.startswith('@')
                                            else ast.literal_eval(text))
    return bindings
