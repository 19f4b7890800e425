"""Tests of failures: errors of storage and messages told in one sentence."""

from absl.testing import absltest

from agents.storage import failures


class MessageTest(absltest.TestCase):

    def test_first_line(self):
        self.assertEqual(failures.first_line(ValueError('\n first\nsecond')), 'first')
        self.assertEqual(failures.first_line(ValueError('abcdef'), limit=3), 'abc')
        self.assertEqual(failures.first_line(ValueError()), 'ValueError')
        error = ValueError('with the traceback')
        error.message = 'the message\ntraceback'  # As TensorFlow's errors have it.
        self.assertEqual(failures.first_line(error), 'the message')
        self.assertEqual(failures.first_line('a text\nmore'), 'a text')

    def test_one_line(self):
        self.assertEqual(failures.one_line(ValueError("No configurable 'x'.\n  In file a.gin\n")),
                         "No configurable 'x'. In file a.gin")
        self.assertEqual(failures.one_line(ValueError('a  b\tc'), limit=3), 'a b')
        self.assertEqual(failures.one_line(KeyError()), 'KeyError')


class DescribeErrorTest(absltest.TestCase):

    def test_describe_permission_denied(self):
        from google.api_core import exceptions
        error = exceptions.Forbidden('POST https://storage.googleapis.com/upload/storage/v1/b/'
                                     'runs/o: someone@example.com does not have '
                                     'storage.objects.create access\nmore detail')
        message = failures.describe_error('gs://runs/run', error)
        self.assertIn('permission denied', message)
        self.assertIn('bucket runs', message)
        self.assertNotIn('\n', message)

    def test_describe_permission_denied_behind_another_error(self):
        from google.api_core import exceptions
        try:
            try:
                raise exceptions.Forbidden('denied')
            except exceptions.Forbidden as cause:
                raise OSError('upload failed') from cause
        except OSError as error:
            message = failures.describe_error('gs://runs/run', error)
        self.assertIn('permission denied', message)

    def test_describe_no_credentials(self):
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions
        for error in (auth_exceptions.DefaultCredentialsError(
                          'Your default credentials were not found.\nTo set up ...'),
                      exceptions.Unauthorized('Anonymous caller does not have access')):
            message = failures.describe_error('gs://runs/run', error)
            self.assertIn('no credentials', message)
            self.assertIn('gcloud auth application-default login', message)
            self.assertNotIn('\n', message)

    def test_describe_missing_bucket(self):
        from google.api_core import exceptions
        message = failures.describe_error('gs://missing-bucket/run',
                                         exceptions.NotFound('The specified bucket does not '
                                                             'exist.'))
        self.assertIn('bucket missing-bucket', message)
        self.assertIn('does not exist', message)

    def test_describe_anything_else(self):
        message = failures.describe_error('gs://runs/run', ConnectionError('refused\nmore'))
        self.assertEqual(message, 'cannot access gs://runs/run: ConnectionError: refused')


class TransientTest(absltest.TestCase):

    def test_outages_are_transient_refusals_are_not(self):
        from google.api_core import exceptions
        for error in (ConnectionRefusedError('refused'), TimeoutError('timed out'),
                      exceptions.ServiceUnavailable('down'), exceptions.TooManyRequests('slow')):
            self.assertTrue(failures.is_transient(error), error)
        wrapped = RuntimeError('upload failed')
        wrapped.__cause__ = exceptions.Forbidden('denied')
        for error in (exceptions.Unauthorized('who'), exceptions.NotFound('no bucket'),
                      wrapped, failures.StorageError('no filesystem'), FileNotFoundError('x')):
            self.assertFalse(failures.is_transient(error), error)

    def test_backoff_doubles_to_its_maximum_with_jitter(self):
        delays = failures.backoff_delays(1.0, 8.0)
        for ceiling in (1, 2, 4, 8, 8, 8):
            self.assertBetween(next(delays), ceiling / 2, ceiling)


if __name__ == '__main__':
    absltest.main()
