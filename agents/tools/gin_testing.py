"""For the tests of gin-configurable classes that our code constructs itself: a binding of an
argument the code passes would do nothing, so gin must refuse it (`denylist`)."""

import gin
from absl.testing import absltest


class BindingTestCase(absltest.TestCase):
    """Clears gin's configuration around each test."""

    def setUp(self):
        super().setUp()
        gin.clear_config()
        self.addCleanup(gin.clear_config)

    def assert_bindings_refused(self, configurable, arguments):
        """A binding of each of `configurable`'s `arguments` fails to parse, naming it."""
        self.assertNotEmpty(arguments)
        for argument in arguments:
            with self.subTest(argument), self.assertRaisesRegex(
                    ValueError, f"Configurable '{configurable}' has denylisted kwarg "
                    f"'{argument}'"):
                gin.parse_config([f'{configurable}.{argument} = None'])
