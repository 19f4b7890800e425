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
    scheduler:                               # optional: stop the worse trials early
      type: successive_halving               # or hyperband (brackets: N)
      min_steps: 5000                        # the first rung's budget
      reduction_factor: 3                    # the top 1/3 of each rung go on
      metric: mean_return                    # a field of the trainer's metrics.jsonl
      mode: max
    populations:                             # optional: how trials share a trainer
      pack: true                             # the default; false trains every trial alone
      max_members: 8                         # trials per population (default 8)

Instead of grid and random, `search` proposes configurations with Optuna
(pipelines/sweep/search.py):

    search: {sampler: tpe, num_trials: 27, parallel: 9, seed: 0, parameters: {...}}

with `parameters` as random's (plus int_uniform and int_log_uniform) and `startup_trials` (TPE's
random start, 10 by default); with a scheduler each batch of `parallel` proposals is halved
before the next is asked (pipelines/sweep/scheduler.py). Successive halving (pipelines/halving.py)
trains every configuration to `min_steps`, then each rung the top 1/reduction_factor of the last
one `reduction_factor` times longer, up to budget.env_steps, continuing each trial from its
checkpoint.

Without a scheduler, trials on native environments that differ only in their seeds and in
scalars such as the learning rate are packed into populations, trained by one compiled program
each (pipelines/sweep/packing.py); their results are recorded trial by trial as those of trials
trained alone.

Every mistake is a `SpecError` of the form `path:line: message`, raised before any trial starts:
`load` checks the structure, `check_gin` parses every parameter and configuration with gin.
Values become gin literals (strings quoted, except `@reference` and `%macro`); YAML 1.2 numbers
such as `1e-4` are floats. A trial's id is `<config id>-seed<seed>`, the config id a hash of its
gin files and bindings, so ids stay the same across runs, machines and spec reorderings.
"""

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import random
import re

import yaml

from agents.runs import gin_text, metrics, run_config, run_dir
from agents.storage import locations
from pipelines import halving

BUDGET_BINDING = run_config.BUDGET_BINDING
DISTRIBUTIONS = ('uniform', 'log_uniform', 'choice', 'int_uniform', 'int_log_uniform')
FIELDS = ('gin_files', 'bindings', 'budget', 'seeds', 'grid', 'random', 'scheduler', 'search',
          'populations')
POPULATIONS_FIELDS = ('pack', 'max_members')
DEFAULT_MAX_POPULATION = 8
# Set by the sweep for the trials it packs (pipelines/sweep/packing.py), not by a spec.
SCHEDULERS = ('successive_halving', 'hyperband')
SCHEDULER_FIELDS = ('type', 'min_steps', 'reduction_factor', 'metric', 'mode', 'brackets')
SAMPLERS = ('tpe', 'random')
SEARCH_FIELDS = ('sampler', 'num_trials', 'parallel', 'seed', 'startup_trials', 'metric', 'mode',
                 'parameters')
DEFAULT_STARTUP_TRIALS = 10  # Optuna's TPESampler(n_startup_trials).
MODES = ('max', 'min')
DEFAULT_METRIC, DEFAULT_MODE = 'mean_return', 'max'
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
class Scheduler:
    """Early stopping by successive halving; HyperBand runs `brackets` of it side by side."""
    type: str  # One of SCHEDULERS.
    min_steps: int  # The budget of the first rung (of the most aggressive bracket).
    reduction_factor: int  # Each rung keeps the top 1/reduction_factor of the last one.
    brackets: int  # 1 for successive halving.


@dataclasses.dataclass(frozen=True)
class Search:
    """Configurations proposed by an Optuna sampler (ask/tell), `parallel` at a time."""
    sampler: str  # One of SAMPLERS.
    num_trials: int  # Configurations proposed in all (each trained with every seed).
    parallel: int  # Configurations proposed together, trained side by side.
    seed: int
    distributions: dict  # Parameter name -> (kind, arguments), as `Spec.distributions`.
    # TPE proposes at random until this many configurations have been told.
    startup_trials: int = DEFAULT_STARTUP_TRIALS


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
    scheduler: Scheduler | None = None
    search: Search | None = None
    metric: str = DEFAULT_METRIC  # What the scheduler ranks and the search optimizes by.
    mode: str = DEFAULT_MODE
    pack_populations: bool | None = None  # populations.pack; None: where the sweep can.
    max_population: int = DEFAULT_MAX_POPULATION  # populations.max_members.
    lines: dict = dataclasses.field(compare=False, repr=False, default_factory=dict)

    def error(self, location, message):
        """A SpecError at the line of `location`, a path of keys into the YAML document."""
        return _error_at(self.path, self.lines, location, message)

    def canonical(self):
        """The spec's content, independent of formatting, comments and key order."""
        fields = dataclasses.asdict(self)
        del fields['path'], fields['lines']
        return json.loads(json.dumps(fields, sort_keys=True))

    def configurations(self):
        """The varied bindings of every configuration: grid points crossed with samples.

        A spec with `search` has its configurations proposed as the sweep goes
        (pipelines/sweep/search.py) instead.
        """
        if self.search is not None:
            raise ValueError('the configurations of a search are proposed by its sampler')
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
            values[name] = quantile(kind, arguments, u)
        return values

    def base_bindings(self):
        """The bindings every trial shares: the fixed ones and the budget."""
        return [gin_text.binding(name, value) for name, value in sorted(self.bindings.items())] + [
            gin_text.binding(BUDGET_BINDING, self.env_steps)]

    def trials(self):
        """Every trial, configurations in order, each with every seed."""
        return [trial for index, configuration in enumerate(self.configurations())
                for trial in self.trials_of(configuration, index)]

    def trials_of(self, configuration, config_index):
        """The trials (one per seed) of `configuration`, the `config_index`th of the sweep."""
        gin_bindings = tuple(self.base_bindings() + [
            gin_text.binding(name, value) for name, value in sorted(configuration.items())])
        config_id = gin_text.config_hash([list(self.gin_files), list(gin_bindings)], 8)
        return [Trial(f'{config_id}-seed{seed}', config_id, config_index * len(self.seeds) + k,
                      seed, configuration, gin_bindings)
                for k, seed in enumerate(self.seeds)]

    @property
    def packs_populations(self):
        """Whether trials are packed into populations: by default, unless a scheduler continues
        single trials from their checkpoints rung after rung."""
        return self.pack_populations is not False and self.scheduler is None

    def varied_distributions(self):
        """The distributions configurations are drawn from: the search's, else random's."""
        return self.search.distributions if self.search else self.distributions


def quantile(kind, arguments, u):
    """The value of distribution (kind, arguments) at `u` in [0, 1): a draw for a uniform `u`."""
    if kind == 'choice':
        return arguments[min(int(u * len(arguments)), len(arguments) - 1)]
    low, high = arguments
    if kind == 'uniform':
        return round_draw(low + u * (high - low))
    if kind == 'log_uniform':
        return round_draw(math.exp(math.log(low) + u * (math.log(high) - math.log(low))))
    if kind == 'int_uniform':
        return min(low + int(u * (high - low + 1)), high)
    # int_log_uniform: log-uniform over [low - 0.5, high + 0.5), rounded, as Optuna's.
    value = math.exp(math.log(low - 0.5) + u * (math.log(high + 0.5) - math.log(low - 0.5)))
    return min(max(round(value), low), high)


def find(path):
    """The spec file: relative paths from the caller's directory, else among the bundled ones
    (so `--spec=configs/sweeps/pendulum.yaml` works from anywhere)."""
    candidates = [locations.resolve(path)]
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


def document(text, path='<spec>'):
    """The YAML document of spec text as `parse` reads it (YAML 1.2 floats), unchecked: for
    tools that derive specs from a spec."""
    return _read_yaml(text, path)[0]


def parse(text, path='<spec>'):
    """Parses spec text; `path` only names the file in errors."""
    document, lines = _read_yaml(text, path)
    error = functools.partial(_error_at, path, lines)
    _check_fields(document, error)
    gin_files = _gin_files(document, error)
    bindings = _parameters(document.get('bindings') or {}, ('bindings',), error)
    for name, value in bindings.items():
        _check_value(value, ('bindings', name), error)
    env_steps, timeout_s = _budget(document, error)
    seeds = _seeds(document, error)
    grid = _grid(document, error)
    num_samples, random_seed, distributions = _random(document, error)
    search = _search(document, error)
    _check_search_alone(document, search, error)
    scheduler = _scheduler(document, env_steps, error)
    metric, mode = _objective(document, error)
    pack_populations, max_population = _populations(document, scheduler, error)
    _check_varied(bindings, grid, distributions, search, error)
    return Spec(path=path, gin_files=tuple(gin_files), bindings=bindings, env_steps=env_steps,
                timeout_s=float(timeout_s) if timeout_s is not None else None,
                seeds=tuple(seeds), grid=grid, num_samples=num_samples,
                random_seed=random_seed, distributions=distributions, scheduler=scheduler,
                search=search, metric=metric, mode=mode, pack_populations=pack_populations,
                max_population=max_population, lines=lines)


def _check_fields(document, error):
    """Refuses a document that is no mapping, an unknown field or a missing required one."""
    if not isinstance(document, dict):
        raise error((), 'a sweep spec is a mapping with the fields ' + ', '.join(FIELDS))
    for key in document:
        if key not in FIELDS:
            raise error((key,), f'unknown field {key!r}; expected one of {", ".join(FIELDS)}')
    for key in ('gin_files', 'budget'):
        if key not in document:
            raise error((), f'missing field {key!r}')


def _gin_files(document, error):
    gin_files = document['gin_files']
    if isinstance(gin_files, str):
        gin_files = [gin_files]
    if not isinstance(gin_files, list) or not gin_files or not all(
            isinstance(name, str) and name for name in gin_files):
        raise error(('gin_files',), 'gin_files must be a non-empty list of gin file paths')
    return gin_files


def _budget(document, error):
    """(env_steps, timeout_s or None) from the `budget` field."""
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
    return env_steps, timeout_s


def _seeds(document, error):
    """The list of seeds: `seeds` as a count (1 by default) or a list."""
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
    return seeds


def _grid(document, error):
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
    return grid


def _check_search_alone(document, search, error):
    """Refuses grid or random beside search, which proposes every configuration itself."""
    if search is None:
        return
    for other in ('grid', 'random'):
        if other in document:
            raise error((other,), f'{other} and search exclude each other: search proposes '
                        'every configuration; give its parameters under search.parameters '
                        '(a grid\'s values as {choice: [...]})')


def _check_varied(bindings, grid, distributions, search, error):
    """Refuses a parameter both fixed and varied, or varied twice, and the bindings the sweep
    sets itself (the budget, the seed, a population's)."""
    searched = search.distributions if search else {}
    where_varied = {**{name: ('search', 'parameters', name) for name in searched},
                    **{name: ('random', 'parameters', name) for name in distributions},
                    **{name: ('grid', name) for name in grid}}
    for name in list(grid) + list(distributions) + list(searched):
        where = where_varied[name]
        if name in bindings:
            raise error(where, f'{name} is both fixed in bindings and varied')
        if name in grid and name in distributions:
            raise error(where, f'{name} is varied by both grid and random')
    for name in list(bindings) + list(where_varied):
        where = ('bindings', name) if name in bindings else where_varied[name]
        if name == BUDGET_BINDING:
            raise error(where, f'{BUDGET_BINDING} is set by budget.env_steps')
        if name == run_dir.SEED_BINDING:
            raise error(where, f'{run_dir.SEED_BINDING} is set by seeds')
        if name in run_dir.POPULATION_BINDINGS:
            raise error(where, f'{name} is set by the sweep when it packs trials into '
                        'populations (see populations.pack); a trial is one run')


def check_gin(spec):
    """Parses every varied parameter and every configuration with gin, as the trainer will.

    Raises SpecError at the line of an unknown gin parameter or configurable, a missing gin file
    or an unknown environment, and every run setting `RunSettings.validate` refuses. Imports the
    run's settings and the algorithms (TensorFlow) to register their configurables, which is why
    `load` does not do this: Beam workers read specs without TensorFlow.
    """
    import gin

    from agents.algorithms import registry  # noqa: F401 (registers the algorithms)
    from agents.runs import run_settings

    def check(gin_bindings, location, what):
        try:
            with quiet_gin_includes():
                run_config.load(list(spec.gin_files), list(gin_bindings), seed=0)
            run_settings.from_gin()
        except run_config.ConfigError as error:
            if 'gin file' in str(error) and 'not found' in str(error):
                location = ('gin_files', _missing_file_index(spec, str(error)))
            raise spec.error(location, f'{what}: {error}') from None
        finally:
            gin.clear_config()

    check([], ('gin_files',), 'gin files')
    for name, value in spec.bindings.items():
        check([gin_text.binding(name, value)], ('bindings', name), f'binding {name}')
    check([gin_text.binding(BUDGET_BINDING, spec.env_steps)], ('budget', 'env_steps'), 'budget')
    for name, values in spec.grid.items():
        for index, value in enumerate(values):
            check([gin_text.binding(name, value)], ('grid', name, index), f'grid parameter {name}')
    section = 'search' if spec.search else 'random'
    for name, (kind, arguments) in spec.varied_distributions().items():
        for value in (arguments if kind == 'choice' else arguments[:1]):
            check([gin_text.binding(name, value)], (section, 'parameters', name),
                  f'{section} parameter {name}')
    if spec.search:  # One configuration: the first value of every distribution.
        configurations = [{name: arguments[0] for name, (_, arguments) in
                           spec.search.distributions.items()}]
    else:
        configurations = spec.configurations()
    for index, configuration in enumerate(configurations):
        trial = spec.trials_of(configuration, index)[0]
        check(trial.gin_bindings, ('grid',) if spec.grid else (section,),
              f'configuration {trial.config_id} ({json.dumps(trial.bindings)})')


@contextlib.contextmanager
def quiet_gin_includes():
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


def _scheduler(document, env_steps, error):
    if 'scheduler' not in document:
        return None
    scheduler = document['scheduler']
    where = ('scheduler',)
    if not isinstance(scheduler, dict):
        raise error(where, 'scheduler must be a mapping such as {type: successive_halving, '
                    'min_steps: N, reduction_factor: 3}')
    _known_fields(scheduler, SCHEDULER_FIELDS, where, error)
    kind = scheduler.get('type')
    if kind not in SCHEDULERS:
        raise error(where + ('type',) if 'type' in scheduler else where,
                    f'unknown scheduler type {kind!r}; expected one of {", ".join(SCHEDULERS)}')
    min_steps = scheduler.get('min_steps')
    if not _is_int(min_steps) or min_steps < 1:
        raise error(where + ('min_steps',) if 'min_steps' in scheduler else where,
                    f'scheduler.min_steps must be a positive integer, got {min_steps!r}')
    if min_steps >= env_steps:
        raise error(where + ('min_steps',), f'scheduler.min_steps ({min_steps}) must be below '
                    f'budget.env_steps ({env_steps}): it is the budget of the first rung, which '
                    'stops short of the full budget')
    factor = scheduler.get('reduction_factor', 3)
    if not _is_int(factor) or factor < 2:
        raise error(where + ('reduction_factor',), 'scheduler.reduction_factor must be an '
                    f'integer >= 2 (each rung keeps the top 1/reduction_factor), got {factor!r}')
    rungs = len(halving.rung_budgets(min_steps, factor, env_steps))
    if kind == 'successive_halving':
        if 'brackets' in scheduler:
            raise error(where + ('brackets',), 'brackets is an option of type: hyperband')
        brackets = 1
    else:
        brackets = scheduler.get('brackets', rungs)
        if not _is_int(brackets) or not 1 <= brackets <= rungs:
            raise error(where + ('brackets',), f'scheduler.brackets must be an integer from 1 '
                        f'to {rungs}, the number of rungs from min_steps to budget.env_steps; '
                        f'got {brackets!r}')
        if brackets > 1 and 'search' in document:
            raise error(where + ('type',), 'hyperband with search is not supported: each batch '
                        'the search proposes is halved as one bracket from the first rung; use '
                        'type: successive_halving')
    return Scheduler(type=kind, min_steps=min_steps, reduction_factor=factor, brackets=brackets)


def _search(document, error):
    if 'search' not in document:
        return None
    search = document['search']
    where = ('search',)
    if not isinstance(search, dict):
        raise error(where, 'search must be a mapping such as {sampler: tpe, num_trials: 27, '
                    'parallel: 3, parameters: {...}}')
    _known_fields(search, SEARCH_FIELDS, where, error)
    sampler = search.get('sampler')
    if sampler not in SAMPLERS:
        raise error(where + ('sampler',) if 'sampler' in search else where,
                    f'unknown sampler {sampler!r}; expected one of {", ".join(SAMPLERS)}')
    values = {}
    for key in ('num_trials', 'parallel'):
        value = search.get(key)
        if not _is_int(value) or value < 1:
            raise error(where + (key,) if key in search else where,
                        f'search.{key} must be a positive integer, got {value!r}')
        values[key] = value
    if values['num_trials'] < values['parallel']:
        raise error(where + ('num_trials',), f'search.num_trials ({values["num_trials"]}) must '
                    f'be at least search.parallel ({values["parallel"]}), the configurations '
                    'proposed at once')
    seed = search.get('seed', 0)
    if not _is_int(seed) or seed < 0:
        raise error(where + ('seed',), f'search.seed must be an integer >= 0, got {seed!r}')
    startup_trials = search.get('startup_trials', DEFAULT_STARTUP_TRIALS)
    if 'startup_trials' in search and sampler != 'tpe':
        raise error(where + ('startup_trials',), 'startup_trials is an option of sampler: tpe')
    if not _is_int(startup_trials) or startup_trials < 0:
        raise error(where + ('startup_trials',), f'search.startup_trials must be an integer '
                    f'>= 0, got {startup_trials!r}')
    parameters = _parameters(search.get('parameters'), where + ('parameters',), error)
    if not parameters:
        raise error(where + ('parameters',) if 'parameters' in search else where,
                    'search.parameters must map gin parameters to distributions')
    distributions = {name: _distribution(spec, where + ('parameters', name), name, error)
                     for name, spec in parameters.items()}
    return Search(sampler=sampler, seed=seed, distributions=distributions,
                  startup_trials=startup_trials, **values)


def _populations(document, scheduler, error):
    """(pack_populations, max_population) from the `populations` field."""
    section = document.get('populations')
    if section is None:
        return None, DEFAULT_MAX_POPULATION
    where = ('populations',)
    if not isinstance(section, dict):
        raise error(where, 'populations must be a mapping such as {pack: true, max_members: 8}')
    _known_fields(section, POPULATIONS_FIELDS, where, error)
    pack = section.get('pack')
    if pack is not None and not isinstance(pack, bool):
        raise error(where + ('pack',), f'populations.pack must be true or false, got {pack!r}')
    if pack and scheduler is not None:
        raise error(where + ('pack',), 'populations.pack: true does not go with a scheduler: '
                    'each rung continues single trials from their own checkpoints; remove it '
                    '(trials then train alone) or the scheduler')
    max_members = section.get('max_members', DEFAULT_MAX_POPULATION)
    if not _is_int(max_members) or max_members < 2:
        raise error(where + ('max_members',), 'populations.max_members must be an integer >= 2 '
                    f'(to train every trial alone: pack: false), got {max_members!r}')
    return pack, max_members


def _objective(document, error):
    """(metric, mode) from the scheduler and the search, which must agree."""
    chosen = {}
    for field in ('scheduler', 'search'):
        section = document.get(field)
        if not isinstance(section, dict):
            continue
        for key, default, choices in (('metric', DEFAULT_METRIC, metrics.EVALUATION_METRICS),
                                      ('mode', DEFAULT_MODE, MODES)):
            value = section.get(key, default)
            if value not in choices:
                what = ('not a metric the trainer writes (in metrics.jsonl)' if key == 'metric'
                        else 'not a mode')
                raise error((field, key), f'{field}.{key}: {value!r} is {what}; expected one '
                            f'of {", ".join(choices)}')
            if key in chosen and chosen[key] != value:
                raise error((field, key), f'search.{key} ({value}) differs from '
                            f'scheduler.{key} ({chosen[key]}): the search optimizes what the '
                            'scheduler ranks by')
            chosen[key] = value
    return chosen.get('metric', DEFAULT_METRIC), chosen.get('mode', DEFAULT_MODE)


def _known_fields(section, known, where, error):
    for key in section:
        if key not in known:
            raise error(where + (key,), f'unknown {where[-1]} field {key!r}; expected one of '
                        f'{", ".join(known)}')


def _distribution(spec, location, name, error):
    usage = ('{uniform: [low, high]}, {log_uniform: [low, high]} (0 < low), '
             '{int_uniform: [low, high]}, {int_log_uniform: [low, high]} (0 < low) or '
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
    if kind.endswith('log_uniform') and low <= 0:
        raise error(location + (kind,), f'{name}: {kind} needs 0 < low, got {low}')
    if kind.startswith('int_'):
        if not (_is_int(low) and _is_int(high)):
            raise error(location + (kind,), f'{name}: {kind} needs integer bounds, got '
                        f'[{low}, {high}]')
        return kind, [low, high]
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


def round_draw(value):
    """A drawn float to SIGNIFICANT_DIGITS: readable ids and summaries."""
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
