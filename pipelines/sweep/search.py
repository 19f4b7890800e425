"""Model-based search for sweeps: configurations proposed by Optuna's samplers (ask/tell).

The sweep asks for `parallel` configurations at a time (a batch), trains them with every seed
(with a scheduler: halves them, pipelines/sweep/scheduler.py), and tells the sampler each
configuration's outcome: its score (pipelines/halving.py: the mean over seeds of the metric) at
each budget it reached, and whether it completed the full budget or was pruned. TPE (Bergstra et
al. 2011, Optuna's TPESampler) models the outcomes told so far once `startup_trials` are in
(before that it proposes at random), ranking pruned configurations below completed ones as it
does with Optuna's pruners; `constant_liar` keeps the proposals of one batch apart. The study
lives in `<output_dir>/search.db`, an SQLite file through Optuna's RDB storage. In a bucket the
launcher works on a local copy and uploads it after every change: the launcher owns the file
(one launcher per sweep).

Resuming proposes the same configurations: the sampler of batch b is seeded from (seed, b), so
its proposals depend only on the seed and on what was told before, and a batch already asked is
read back from the study rather than asked again.
"""

import contextlib
import hashlib
import os
import shutil
import tempfile

import optuna

from agents.runs import run_dir
from agents.storage import file_io, locations
from pipelines.sweep import sweep_spec

STUDY_NAME = 'sweep'
BATCH_ATTR = 'batch'


class Study:
    """The Optuna study of a sweep with `search`; a context that stores it on exit."""

    def __init__(self, spec, output_dir):
        if spec.search is None:
            raise ValueError('the spec has no search')
        self._spec = spec
        self._search = spec.search
        self._url = locations.join(output_dir, run_dir.STUDY_FILE)
        self._stack = contextlib.ExitStack()
        if locations.is_remote(output_dir):
            directory = tempfile.mkdtemp(prefix='sweep-search-')
            self._stack.callback(shutil.rmtree, directory, ignore_errors=True)
            self._path = os.path.join(directory, run_dir.STUDY_FILE)
            if file_io.exists(self._url):
                file_io.download(self._url, self._path)
        else:
            self._path = self._url
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._storage = optuna.storages.RDBStorage(f'sqlite:///{self._path}')
        self._study = optuna.create_study(
            storage=self._storage, study_name=STUDY_NAME, load_if_exists=True,
            direction='maximize' if spec.mode == 'max' else 'minimize')
        self._distributions = {name: _optuna_distribution(kind, arguments)
                               for name, (kind, arguments) in self._search.distributions.items()}

    def __enter__(self):
        return self

    def __exit__(self, *unused_exc_info):
        self.close()

    def close(self):
        self._storage.remove_session()
        with contextlib.suppress(AttributeError):
            self._storage.engine.dispose()
        self._stack.close()

    @property
    def num_batches(self):
        return -(-self._search.num_trials // self._search.parallel)

    def batch(self, index):
        """[(trial number, configuration)] of batch `index`: asked now or read back if it was."""
        asked = [trial for trial in self._trials() if trial.user_attrs.get(BATCH_ATTR) == index]
        size = min(self._search.parallel,
                   self._search.num_trials - index * self._search.parallel)
        if len(asked) < size:
            self._study.sampler = self._sampler(index)
            for _ in range(size - len(asked)):
                trial = self._study.ask(self._distributions)
                trial.set_user_attr(BATCH_ATTR, index)
            self.store()
            asked = [trial for trial in self._trials()
                     if trial.user_attrs.get(BATCH_ATTR) == index]
        return [(trial.number, self.configuration(trial)) for trial in asked]

    def tell(self, number, scores, completed=True):
        """Tells trial `number` its outcome: {budget: score} of the budgets it was scored at.

        A completed trial's value is its score at the last budget; a pruned one
        (`completed=False`) is told PRUNED with its scores as intermediate values, so TPE ranks
        it below every completed trial, by the last budget it reached and then its score there.
        A last score of None (a seed failed) marks the trial failed, which TPE leaves out.
        Telling a trial told before changes nothing (a resumed sweep tells its batches again).
        """
        trial_id = self._storage.get_trial_id_from_study_id_trial_number(
            self._storage.get_study_id_from_name(STUDY_NAME), number)
        trial = self._storage.get_trial(trial_id)
        if trial.state.is_finished():
            return
        value = list(scores.values())[-1] if scores else None
        for budget, score in scores.items():
            if score is not None and budget not in trial.intermediate_values:
                self._storage.set_trial_intermediate_value(trial_id, budget, score)
        if value is None:
            state = optuna.trial.TrialState.FAIL
        elif completed:
            state = optuna.trial.TrialState.COMPLETE
        else:
            state, value = optuna.trial.TrialState.PRUNED, None
        self._study.tell(number, value, state=state)

    def store(self):
        """Uploads the study, in a bucket (a local study is stored as it changes)."""
        if self._path != self._url:
            file_io.upload(self._path, self._url)

    def proposed(self):
        """[(trial number, configuration)] of every configuration asked so far, in order."""
        return [(trial.number, self.configuration(trial)) for trial in self._trials()]

    def told(self):
        """{trial number: value or None} of the trials told so far."""
        return {trial.number: trial.value for trial in self._trials()
                if trial.state.is_finished()}

    def configuration(self, trial):
        """The varied bindings of an Optuna trial, rounded as the random sampler rounds."""
        values = {}
        for name, (kind, arguments) in self._search.distributions.items():
            value = trial.params[name]
            if kind == 'choice':
                if not _plain(arguments):
                    value = arguments[value]
            elif kind in ('uniform', 'log_uniform'):
                value = sweep_spec.round_draw(value)
            values[name] = value
        return values

    def _trials(self):
        return sorted(self._study.get_trials(deepcopy=False), key=lambda trial: trial.number)

    def _sampler(self, index):
        seed = int(hashlib.sha256(f'{self._search.seed}/{index}'.encode()).hexdigest()[:8], 16)
        if self._search.sampler == 'tpe':
            return optuna.samplers.TPESampler(
                seed=seed, constant_liar=True, n_startup_trials=self._search.startup_trials)
        return optuna.samplers.RandomSampler(seed=seed)


def _optuna_distribution(kind, arguments):
    if kind == 'choice':
        choices = arguments if _plain(arguments) else list(range(len(arguments)))
        return optuna.distributions.CategoricalDistribution(choices)
    low, high = arguments
    if kind.startswith('int_'):
        return optuna.distributions.IntDistribution(low, high, log=kind == 'int_log_uniform')
    return optuna.distributions.FloatDistribution(low, high, log=kind == 'log_uniform')


def _plain(values):
    """Whether Optuna can store `values` as categorical choices (None, bool, int, float, str)."""
    return all(value is None or isinstance(value, bool | int | float | str) for value in values)

