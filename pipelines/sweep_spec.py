"""Sweep specs: a YAML file in, a checked list of trials with stable ids out.

A spec names the base gin files, fixed bindings, the per-trial budget, the seeds and what to vary
(a grid, random samples, or both crossed); see configs/sweeps/pendulum.yaml:

    gin_files: [configs/pendulum.gin]       # resolved like the trainer's --gin_file
    bindings: {train.eval_episodes: 5}       # fixed for every trial (optional)
    budget: {env_steps: 30000, timeout_s: 900}   # train.total_steps; kill a trial after 900 s
    seeds: 3                                 # seeds 0, 1, 2; or a list such as [0, 7]
    grid:                                    # every combination of the listed values
      PPO.learning_rate: [3.0e-4, 1.0e-3]
    random:                                  # num_samples draws, crossed with the grid
      num_samples: 4
      seed: 0
      parameters:
        PPO.clip_ratio: {uniform: [0.1, 0.3]}
        PPO.entropy_coef: {log_uniform: [1.0e-4, 1.0e-2]}
        PPO.num_epochs: {choice: [4, 10]}

Every mistake is a `SpecError` of the form `path:line: message`, raised before any trial starts:
`load` checks the structure, `check_gin` parses every parameter and configuration with gin.
Values become gin literals (strings quoted, except `@reference` and `%macro`); YAML 1.2 numbers
such as `1e-4` are floats. A trial's id is `<config id>-seed<seed>`, the config id a hash of its
gin files and bindings, so ids stay the same across runs, machines and spec reorderings.
"""

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import random
import re

import yaml

from agents.runs import run_config

BUDGET_BINDING = 'train.total_steps'
SEED_BINDING = 'train.seed'
DISTRIBUTIONS = ('uniform', 'log_uniform', 'choice')
FIELDS = ('gin_files', 'bindings', 'budget', 'seeds', 'grid', 'random')
SIGNIFICANT_DIGITS = 4  # Random draws are rounded, so ids and summaries stay readable.
_PARAMETER = re.compile(r'^(?:[A-Za-z_][\w.]*/)*[A-Za-z_][\w.]*\.[A-Za-z_]\w*$')


class SpecError(Exception):
    """A mistake in a sweep spec, told as `path:line: message`."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One training run of the sweep: a configuration and a seed."""
    id: str
    config_id: str
    index: int
    seed: int
    bindings: dict  # The varied parameters and their values.
    gin_bindings: tuple  # Every binding the trainer gets: fixed, budget, varied.


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed, structurally valid sweep spec."""
    path: str
    gin_files: tuple
    bindings: dict
    env_steps: int
    timeout_s: float | None
    seeds: tuple
    grid: dict
    num_samples: int
    random_seed: int
    distributions: dict
    lines: dict = dataclasses.field(compare=False, repr=False)

    def error(self, location, message):
        """A SpecError at the line of `location`, a path of keys into the YAML document."""
        return _error_at(self.path, self.lines, location, message)

    def canonical(self):
        """The spec's content, independent of formatting, comments and key order."""
        fields = dataclasses.asdict(self)
        del fields['path'], fields['lines']
        return json.loads(json.dumps(fields, sort_keys=True))

    def configurations(self):
        """The varied bindings of every configuration: grid points crossed with samples."""
        names = sorted(self.grid)
        points = [dict(zip(names, values, strict=True))
                  for values in itertools.product(*(self.grid[name] for name in names))]
        samples = [self.sample(index) for index in range(self.num_samples)] or [{}]
        configurations, seen = [], set()
        for point, sample in itertools.product(points, samples):
            configuration = {**point, **sample}
            key = json.dumps(configuration, sort_keys=True)
            if key not in seen:  # Random choices can repeat a configuration.
                seen.add(key)
                configurations.append(configuration)
        return configurations

    def sample(self, index):
        """Random sample `index`: the same for a seed whatever `num_samples` is."""
        values = {}
        for name in sorted(self.distributions):
            kind, arguments = self.distributions[name]
            # Seeding with a string and random() are stable across Python versions.
            u = random.Random(f'{self.random_seed}/{index}/{name}').random()
            if kind == 'choice':
                values[name] = arguments[min(int(u * len(arguments)), len(arguments) - 1)]
            elif kind == 'uniform':
                values[name] = _round(arguments[0] + u * (arguments[1] - arguments[0]))
            else:
                low, high = math.log(arguments[0]), math.log(arguments[1])
                values[name] = _round(math.exp(low + u * (high - low)))
        return values

    def base_bindings(self):
        """The bindings every trial shares: the fixed ones and the budget."""
        return [gin_binding(name, value) for name, value in sorted(self.bindings.items())] + [
            gin_binding(BUDGET_BINDING, self.env_steps)]

    def trials(self):
        """Every trial, configurations in order, each with every seed."""
        trials = []
        for configuration in self.configurations():
            gin_bindings = tuple(self.base_bindings() + [
                gin_binding(name, value) for name, value in sorted(configuration.items())])
            config_id = hashlib.sha256(json.dumps(
                [list(self.gin_files), list(gin_bindings)]).encode()).hexdigest()[:8]
            for seed in self.seeds:
                trials.append(Trial(f'{config_id}-seed{seed}', config_id, len(trials), seed,
                                    configuration, gin_bindings))
        return trials


def gin_binding(name, value):
    return f'{name} = {gin_literal(value)}'


def gin_literal(value):
    """A YAML value as gin text: Python literals, except `@reference` and `%macro` strings."""
    if isinstance(value, str) and value[:1] in ('@', '%'):
        return value
    return repr(value)


def find(path):
    """The spec file: relative paths from the caller's directory, else among the bundled ones
    (so `--spec=configs/sweeps/pendulum.yaml` works from anywhere)."""
    candidates = [run_config.resolve_path(path)]
    if not os.path.isabs(path):
        candidates.append(os.path.join(run_config.PACKAGE_ROOT, path))
    return next((c for c in candidates if os.path.isfile(c)), candidates[0])


def load(path, name=None):
    """Reads and checks the spec at `path` (called `name` in errors, by default `path`).

    Raises SpecError naming the line of a mistake.
    """
    name = name or path
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except OSError as error:
        raise SpecError(f'{name}: cannot read the sweep spec: {error.strerror or error}') from None
    return parse(text, name)


def parse(text, path='<spec>'):
    """Parses spec text; `path` only names the file in errors."""
    document, lines = _read_yaml(text, path)
    error = functools.partial(_error_at, path, lines)

    if not isinstance(document, dict):
        raise error((), 'a sweep spec is a mapping with the fields ' + ', '.join(FIELDS))
    for key in document:
        if key not in FIELDS:
            raise error((key,), f'unknown field {key!r}; expected one of {", ".join(FIELDS)}')
    for key in ('gin_files', 'budget'):
        if key not in document:
            raise error((), f'missing field {key!r}')

    gin_files = document['gin_files']
    if isinstance(gin_files, str):
        gin_files = [gin_files]
    if not isinstance(gin_files, list) or not gin_files or not all(
            isinstance(name, str) and name for name in gin_files):
        raise error(('gin_files',), 'gin_files must be a non-empty list of gin file paths')

    bindings = _parameters(document.get('bindings') or {}, ('bindings',), error)
    for name, value in bindings.items():
        _check_value(value, ('bindings', name), error)

    budget = document['budget']
    if not isinstance(budget, dict):
        raise error(('budget',), 'budget must be a mapping: {env_steps: N, timeout_s: S}')
    for key in budget:
        if key not in ('env_steps', 'timeout_s'):
            raise error(('budget', key), f'unknown budget field {key!r}; expected env_steps or '
                        'timeout_s')
    env_steps = budget.get('env_steps')
    if not _is_int(env_steps) or env_steps < 1:
        raise error(('budget', 'env_steps') if 'env_steps' in budget else ('budget',),
                    f'budget.env_steps must be a positive integer, got {env_steps!r}')
    timeout_s = budget.get('timeout_s')
    if timeout_s is not None and (not _is_number(timeout_s) or not timeout_s > 0):
        raise error(('budget', 'timeout_s'),
                    f'budget.timeout_s must be a positive number of seconds, got {timeout_s!r}')

    seeds = document.get('seeds', 1)
    if _is_int(seeds):
        if seeds < 1:
            raise error(('seeds',), f'seeds must be a positive count or a list, got {seeds}')
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(
            _is_int(seed) and seed >= 0 for seed in seeds):
        raise error(('seeds',), 'seeds must be a count or a non-empty list of integers >= 0')
    if len(set(seeds)) != len(seeds):
        raise error(('seeds',), f'seeds repeat: {seeds}')

    grid = _parameters(document.get('grid', {}), ('grid',), error)
    if 'grid' in document and not grid:
        raise error(('grid',), 'empty grid: give each parameter a list of values')
    for name, values in grid.items():
        if not isinstance(values, list) or not values:
            raise error(('grid', name), f'grid parameter {name} needs a non-empty list of values')
        for index, value in enumerate(values):
            _check_value(value, ('grid', name, index), error)
        keys = [json.dumps(value, sort_keys=True) for value in values]
        if len(set(keys)) != len(keys):
            raise error(('grid', name), f'grid parameter {name} repeats a value: {values}')

    num_samples, random_seed, distributions = _random(document, error)

    fixed = set(bindings)
    for name in list(grid) + list(distributions):
        where = ('grid', name) if name in grid else ('random', 'parameters', name)
        if name in fixed:
            raise error(where, f'{name} is both fixed in bindings and varied')
        if name in grid and name in distributions:
            raise error(where, f'{name} is varied by both grid and random')
    for name in list(bindings) + list(grid) + list(distributions):
        where = (('bindings', name) if name in bindings else ('grid', name) if name in grid
                 else ('random', 'parameters', name))
        if name == BUDGET_BINDING:
            raise error(where, f'{BUDGET_BINDING} is set by budget.env_steps')
        if name == SEED_BINDING:
            raise error(where, f'{SEED_BINDING} is set by seeds')

    return Spec(path=path, gin_files=tuple(gin_files), bindings=bindings, env_steps=env_steps,
                timeout_s=float(timeout_s) if timeout_s is not None else None,
                seeds=tuple(seeds), grid=grid, num_samples=num_samples,
                random_seed=random_seed, distributions=distributions, lines=lines)


def check_gin(spec):
    """Parses every varied parameter and every configuration with gin, as the trainer will.

    Raises SpecError at the line of an unknown gin parameter or configurable, a missing gin file
    or an unknown environment. Imports the run loop and the algorithms (TensorFlow) to register
    their configurables, which is why `load` does not do this: Beam workers read specs without
    TensorFlow.
    """
    import gin

    from agents.algorithms import registry  # noqa: F401 (registers the algorithms)
    from agents.runs import loop

    def check(gin_bindings, location, what):
        try:
            with _quiet_gin_includes():
                run_config.load(list(spec.gin_files), list(gin_bindings), seed=0)
            loop.check_config()
        except run_config.ConfigError as error:
            if 'gin file' in str(error) and 'not found' in str(error):
                location = ('gin_files', _missing_file_index(spec, str(error)))
            raise spec.error(location, f'{what}: {error}') from None
        finally:
            gin.clear_config()

    check([], ('gin_files',), 'gin files')
    for name, value in spec.bindings.items():
        check([gin_binding(name, value)], ('bindings', name), f'binding {name}')
    check([gin_binding(BUDGET_BINDING, spec.env_steps)], ('budget', 'env_steps'), 'budget')
    for name, values in spec.grid.items():
        for index, value in enumerate(values):
            check([gin_binding(name, value)], ('grid', name, index), f'grid parameter {name}')
    for name, (kind, arguments) in spec.distributions.items():
        for value in (arguments if kind == 'choice' else arguments[:1]):
            check([gin_binding(name, value)], ('random', 'parameters', name),
                  f'random parameter {name}')
    for trial in spec.trials()[::len(spec.seeds)]:
        check(trial.gin_bindings, ('grid',) if spec.grid else ('random',),
              f'configuration {trial.config_id} ({json.dumps(trial.bindings)})')


@contextlib.contextmanager
def _quiet_gin_includes():
    """Hides gin's lines about each search path an include tries (up to ERROR level)."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _missing_file_index(spec, message):
    for index, name in enumerate(spec.gin_files):
        if repr(name) in message:
            return index
    return 0


def _random(document, error):
    if 'random' not in document:
        return 0, 0, {}
    search = document['random']
    if not isinstance(search, dict):
        raise error(('random',), 'random must be a mapping with num_samples, seed and parameters')
    for key in search:
        if key not in ('num_samples', 'seed', 'parameters'):
            raise error(('random', key), f'unknown random field {key!r}; expected num_samples, '
                        'seed or parameters')
    num_samples = search.get('num_samples')
    if not _is_int(num_samples) or num_samples < 1:
        raise error(('random', 'num_samples') if 'num_samples' in search else ('random',),
                    f'random.num_samples must be a positive integer, got {num_samples!r}')
    seed = search.get('seed', 0)
    if not _is_int(seed) or seed < 0:
        raise error(('random', 'seed'), f'random.seed must be an integer >= 0, got {seed!r}')
    parameters = _parameters(search.get('parameters'), ('random', 'parameters'), error)
    if not parameters:
        raise error(('random', 'parameters') if 'parameters' in search else ('random',),
                    'random.parameters must map gin parameters to distributions')
    distributions = {}
    for name, spec in parameters.items():
        distributions[name] = _distribution(spec, ('random', 'parameters', name), name, error)
    return num_samples, seed, distributions


def _distribution(spec, location, name, error):
    usage = ('{uniform: [low, high]}, {log_uniform: [low, high]} (0 < low) or '
             '{choice: [value, ...]}')
    if not isinstance(spec, dict) or len(spec) != 1:
        raise error(location, f'{name}: a distribution is one of {usage}')
    (kind, arguments), = spec.items()
    if kind not in DISTRIBUTIONS:
        raise error(location + (kind,), f'{name}: unknown distribution {kind!r}; expected one '
                    f'of {", ".join(DISTRIBUTIONS)}')
    if kind == 'choice':
        if not isinstance(arguments, list) or not arguments:
            raise error(location + (kind,), f'{name}: choice needs a non-empty list of values')
        for index, value in enumerate(arguments):
            _check_value(value, location + (kind, index), error)
        return kind, arguments
    if (not isinstance(arguments, list) or len(arguments) != 2 or
            not all(_is_number(value) for value in arguments)):
        raise error(location + (kind,), f'{name}: {kind} needs [low, high], two numbers')
    low, high = arguments
    if not low < high:
        raise error(location + (kind,), f'{name}: {kind} needs low < high, got [{low}, {high}]')
    if kind == 'log_uniform' and low <= 0:
        raise error(location + (kind,), f'{name}: log_uniform needs 0 < low, got {low}')
    return kind, [float(low), float(high)]


def _parameters(mapping, location, error):
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise error(location, f'{location[-1]} must map gin parameters (e.g. PPO.learning_rate) '
                    'to values')
    for name in mapping:
        if not isinstance(name, str) or not _PARAMETER.match(name):
            raise error(location + (name,), f'{name!r} is not a gin parameter such as '
                        'PPO.learning_rate')
    return dict(mapping)


def _check_value(value, location, error):
    if isinstance(value, float) and not math.isfinite(value):
        raise error(location, f'{value} is not a finite number')
    if isinstance(value, list | dict):
        for item in (value.values() if isinstance(value, dict) else value):
            _check_value(item, location, error)
    elif not isinstance(value, str | int | float | bool | type(None)):
        raise error(location, f'unsupported value {value!r}; use numbers, strings, booleans, '
                    'lists or mappings')


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _round(value):
    return float(f'{value:.{SIGNIFICANT_DIGITS}g}')


def _error_at(path, lines, location, message):
    """A SpecError at the line of `location`, a path of keys into the YAML document."""
    return SpecError(f'{path}:{_line(lines, location)}: {message}')


def _line(lines, location):
    """The line of the deepest known prefix of `location` (1 for the whole document)."""
    for end in range(len(location), 0, -1):
        if location[:end] in lines:
            return lines[location[:end]]
    return 1


class _Loader(yaml.SafeLoader):
    """YAML with 1.2 floats: `1e-4` is a number, not the string PyYAML's 1.1 rules make it."""


_Loader.add_implicit_resolver(
    'tag:yaml.org,2002:float', re.compile(r'^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$'),
    list('-+0123456789'))


def _read_yaml(text, path):
    """The document and the line of every key and list item, by path of keys."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        document = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecError(f'{path}:{line}: invalid YAML: {error.problem or error}') from None
    except yaml.YAMLError as error:
        raise SpecError(f'{path}:1: invalid YAML: {error}') from None
    finally:
        loader.dispose()
    lines = {}

    def walk(node, location):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    raise SpecError(f'{path}:{key_node.start_mark.line + 1}: keys must be names')
                if key in seen:
                    raise SpecError(f'{path}:{key_node.start_mark.line + 1}: duplicate key '
                                    f'{key!r}')
                seen.add(key)
                lines[location + (key,)] = key_node.start_mark.line + 1
                walk(value_node, location + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[location + (index,)] = item.start_mark.line + 1
                walk(item, location + (index,))

    if node is not None:
        walk(node, ())
    return document, lines
