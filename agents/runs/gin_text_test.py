"""Tests of gin_text: gin configurations read, edited and written as text, and their hash."""

import hashlib
import json

from absl.testing import absltest

from agents.runs import gin_text


class ParseBindingsTest(absltest.TestCase):

    def test_parses_what_gin_writes(self):
        text = (
            '# Parameters for PPO:\n# ====\nPPO.learning_rate = 0.001\n'
            "PPO.policy_network = @FeedForwardGaussianPolicy\n\n"
            "train.wrappers = ['range_normalize',\n    'ClipAction']\n"
            "eval/train.env_id = 'Pendulum-v1'\nFOO = 3\ninclude 'base.gin'\n")
        self.assertEqual(gin_text.parse_bindings(text), {
            'PPO.learning_rate': '0.001',
            'PPO.policy_network': '@FeedForwardGaussianPolicy',
            'train.wrappers': "['range_normalize', 'ClipAction']",
            'eval/train.env_id': "'Pendulum-v1'",
            'FOO': '3',
        })

    def test_invalid_gin_names_the_line(self):
        with self.assertRaisesRegex(ValueError, "line 3: cannot parse 'PPO.c = 2'"):
            gin_text.parse_bindings('PPO.a = 1\nPPO.b = [1,\nPPO.c = 2\n')

    def test_value(self):
        self.assertEqual(gin_text.value('0.001'), 0.001)
        self.assertEqual(gin_text.value("('a', 2)"), ('a', 2))
        self.assertEqual(gin_text.value('@Net'), '@Net')


class WithBindingsTest(absltest.TestCase):
    """A population member's configuration from the population's."""

    def test_sets_in_place_adds_and_removes_whole_statements(self):
        config = ('# Parameters for train:\n'
                  'train.population = 2\n'
                  'train.population_members = \\\n'
                  "    [{'PPO.learning_rate': 0.001}, {}]\n"
                  'train.seed = 0\n'
                  'PPO.learning_rate = 0.0003\n')
        member = gin_text.with_bindings(
            config, {'train.seed': 4, 'PPO.learning_rate': 0.001, 'PPO.clip_ratio': 0.1},
            remove=('train.population', 'train.population_members'))
        self.assertEqual(member, '# Parameters for train:\n'
                                 'train.seed = 4\n'
                                 'PPO.learning_rate = 0.001\n'
                                 'PPO.clip_ratio = 0.1\n')
        self.assertEqual(gin_text.with_bindings(config, {}), config)


class StatementsTest(absltest.TestCase):

    def test_continuation_lines_belong_to_their_statement(self):
        self.assertEqual(gin_text.statements('a = [1,\n    2]\nb = 3\n'),
                         [['a = [1,', '    2]'], ['b = 3']])

    def test_split_binding(self):
        rest, value = gin_text.split_binding('a = 1\ntrain.total_steps = \\\n    1_000\n',
                                             'train.total_steps')
        self.assertEqual((rest, value), ([['a = 1']], 1000))
        self.assertEqual(gin_text.split_binding('a = 1\n', 'b'), (None, None))
        self.assertEqual(gin_text.split_binding('b = 1\nb = 2\n', 'b'), (None, None))
        self.assertEqual(gin_text.split_binding('b = @f\n', 'b'), (None, None))

    def test_binding_name(self):
        self.assertEqual(gin_text.binding_name('eval/PPO.clip = 0.2'), 'eval/PPO.clip')


class LiteralTest(absltest.TestCase):

    def test_references_and_macros_stay_as_written(self):
        self.assertEqual(gin_text.binding('PPO.network', '@Net'), 'PPO.network = @Net')
        self.assertEqual(gin_text.literal('%STEPS'), '%STEPS')
        self.assertEqual(gin_text.literal('Pendulum-v1'), "'Pendulum-v1'")
        self.assertEqual(gin_text.literal({'g': 9.81}), "{'g': 9.81}")


class ConfigHashTest(absltest.TestCase):

    def test_is_the_sha256_of_the_json(self):
        # Trial and population ids are stored in sweeps: the hash must never change.
        content = [['configs/pendulum.gin'], ['train.total_steps = 1000']]
        self.assertEqual(gin_text.config_hash(content, 8),
                         hashlib.sha256(json.dumps(content).encode()).hexdigest()[:8])
        self.assertEqual(gin_text.config_hash(['a'], 10), '0eb5b8d6f8')


if __name__ == '__main__':
    absltest.main()
