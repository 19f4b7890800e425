"""Packs a stage's trials into populations: many trials trained by one compiled program.

Trials whose configuration runs on native environments and that differ only in their seeds and
in scalars a population's members may set (PPO's learning rate, clip ratio, entropy
coefficient, discount and GAE lambda: the algorithm's MEMBER_HYPERPARAMETERS) train together as one
`train.population_members` run (docs/run_loop.md, "Populations"), up to `max_members` at a
time, in the sweep's order. Each trial keeps its own result (`trials/<id>/result.json`), its
run directory being its member's (`populations/<id>/member-<k>/`).

Whether a configuration can be packed is asked of the trainer's own code: the settings of a
population of two are validated and its agent built as the trainer would build it (no
environments but one to read the spaces, no graphs; nothing is written), so only what a
population trains is packed. The rest trains alone, as do the trials of a population
that failed (rerunning the sweep then retries them one by one, so a configuration that diverges
cannot keep failing the trials packed with it).

A stage keeps its populations when its pipeline is rerun after a lost worker: each resumes from
its checkpoints. A rerun of the sweep packs what is left to train anew.
"""

import types

import gin
from absl import logging

from agents.algorithms import registry
from agents.runs import agent_factory, environments, gin_text, run_config, run_dir, run_settings
from agents.storage import failures
from pipelines.sweep import sweep_spec
from pipelines.sweep import trial as trial_lib


class Packer:
    """Packs [(trial, stop_at_step)] into [(trial or trial_lib.Population, stop_at_step)].

    With `workers` (the trials trained at once on this machine), a configuration's trials are
    split into at least that many populations, of sizes differing by at most one, so no worker
    idles while another trains a large population.
    """

    def __init__(self, spec, output_dir, workers=None):
        self._spec = spec
        self._output_dir = output_dir
        self._max_members = spec.max_population
        self._workers = workers or 1
        self._scalars = {}  # A trial's gin bindings -> the names its population may vary.
        self._problems = {}  # A group's shared bindings -> why it cannot be packed, or None.

    def pack(self, work):
        if not self._spec.packs_populations:
            return list(work)
        groups = {}  # (shared bindings, varied scalar names, stop) -> [trial].
        alone = []
        for trial, stop in work:
            if self._failed_in_population(trial):
                alone.append((trial, stop))
                continue
            varied = self._varied_scalars(trial)
            shared = tuple(binding for binding in trial.gin_bindings
                           if gin_text.binding_name(binding) not in varied)
            groups.setdefault((shared, tuple(sorted(varied)), stop), []).append(trial)
        units = []
        for (shared, varied, stop), trials in groups.items():
            problem = self._problem(shared) if len(trials) > 1 else 'one trial'
            if problem:
                if len(trials) > 1:
                    logging.info('%d trials (%s) train alone: %s.', len(trials),
                                 ', '.join(sorted({t.config_id for t in trials})), problem)
                units += [(trial, stop) for trial in trials]
                continue
            for members in self._split(trials):
                units.append((population(members, shared, varied) if len(members) > 1
                              else members[0], stop))
        order = {trial.id: index for index, (trial, _) in enumerate(work)}
        units += alone
        units.sort(key=lambda unit: order[trial_lib.trials_of(unit[0])[0].id])
        return units

    def _split(self, trials):
        """`trials` in order, cut into populations of at most max_members."""
        count = max(-(-len(trials) // self._max_members), min(self._workers, len(trials)))
        size, larger = divmod(len(trials), count)
        chunks, start = [], 0
        for index in range(count):
            end = start + size + (index < larger)
            chunks.append(trials[start:end])
            start = end
        return chunks

    def _failed_in_population(self, trial):
        record = trial_lib.read_result(self._output_dir, trial.id)
        return bool(record) and record['status'] != trial_lib.OK and 'population' in record

    def _varied_scalars(self, trial):
        """The names of the trial's varied bindings that a population member may set."""
        if trial.gin_bindings not in self._scalars:
            names = set()
            with _gin_config(self._spec, trial.gin_bindings) as problem:
                if problem is None:
                    try:
                        algorithm = gin.query_parameter('train.algorithm').scoped_configurable_fn
                        names = {f'{algorithm.__name__}.{scalar}' for scalar in
                                 registry.member_hyperparameters(algorithm)}
                    except (ValueError, AttributeError):
                        pass
            self._scalars[trial.gin_bindings] = {
                name for name, value in trial.bindings.items()
                if name in names and _is_number(value)}
        return self._scalars[trial.gin_bindings]

    def _problem(self, shared):
        """Why trials of these shared bindings cannot train as a population, or None."""
        if shared not in self._problems:
            with _gin_config(self._spec, shared) as problem:
                if problem is None:
                    problem = _population_problem()
            self._problems[shared] = problem
        return self._problems[shared]


class _gin_config:
    """Parses the spec's gin files with `bindings` for the block (as the value of `with`: None,
    or the ConfigError's message); clears gin's configuration after it."""

    def __init__(self, spec, bindings):
        self._spec = spec
        self._bindings = list(bindings)

    def __enter__(self):
        try:
            with sweep_spec.quiet_gin_includes():
                run_config.load(list(self._spec.gin_files), self._bindings, seed=0)
        except run_config.ConfigError as error:
            return str(error)
        return None

    def __exit__(self, *unused_exc_info):
        gin.clear_config()


def _population_problem():
    """Checks the settings of a population of two and builds its agent as the trainer would
    (no environments but one to read the spaces); returns why it cannot, or None."""
    try:
        bound = gin.query_parameter('train.population')
    except ValueError:
        bound = 1
    if bound != 1:
        return f'train.population is bound ({bound!r})'
    try:
        settings = run_settings.from_gin(population=2)
        members, _ = settings.member_overrides()
        observation_space, action_space = environments.spaces(
            settings.env_id, settings.env_kwargs, settings.wrappers)
        agent_factory.build_agent(settings, types.SimpleNamespace(
            observation_space=observation_space, action_space=action_space), members)
        return None
    except run_config.ConfigError as error:
        return str(error)
    except Exception as error:  # The trainer would fail on its own: let it tell the trial.
        return failures.first_line(error)


def population(trials, shared, varied):
    """The Population of `trials` (one configuration's shared bindings, `varied` the names of
    the scalars they set each)."""
    members = [{run_dir.SEED_BINDING: trial.seed,
                **{name: trial.bindings[name] for name in varied}} for trial in trials]
    population_id = 'pop-' + gin_text.config_hash([trial.id for trial in trials], 10)
    population_binding, members_binding = run_dir.POPULATION_BINDINGS
    bindings = tuple(shared) + (
        gin_text.binding(population_binding, len(trials)), f'{members_binding} = {members!r}')
    return trial_lib.Population(population_id, tuple(trials), bindings)


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool)
