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

    def test_a_lost_upload_session_is_transient_a_missing_bucket_is_not(self):
        import requests
        from google.resumable_media import common

        def answer(url):
            response = requests.Response()
            response.status_code, response.url = 404, url
            return common.InvalidResponse(response, 'Request failed with status code', 404)

        lost = answer('http://127.0.0.1:4443/upload/storage/v1/b/runs/o?uploadType=resumable'
                      '&name=run%2Fckpt-1.index&upload_id=5f1c')
        self.assertTrue(failures.is_transient(lost))
        self.assertIn('the storage forgot an interrupted upload',
                      failures.describe_error('gs://runs/run/ckpt-1.index', lost))
        missing = answer('http://127.0.0.1:4443/upload/storage/v1/b/runs/o?uploadType=resumable')
        self.assertFalse(failures.is_transient(missing))
        self.assertIn('bucket runs of gs://runs/run does not exist',
                      failures.describe_error('gs://runs/run', missing))

    def test_an_outage_is_found_in_its_error_or_in_a_pipelines_text_of_it(self):
        outage = failures.OutageError('gs://b/x: storage not answering for 4 s, longer than '
                                      'max_outage_s = 4')
        self.assertEqual(failures.outage_in(outage), str(outage))
        wrapped = RuntimeError('pipeline failed')
        wrapped.__cause__ = outage
        self.assertEqual(failures.outage_in(wrapped), str(outage))
        text = RuntimeError("Pipeline failed:\nTraceback ...\nagents.storage.failures.OutageError: "
                            f"{outage} [while running 'ReadRuns']\n")
        self.assertEqual(failures.outage_in(text), str(outage))
        self.assertIsNone(failures.outage_in(failures.StorageError('permission denied')))

    def test_backoff_doubles_to_its_maximum_with_jitter(self):
        delays = failures.backoff_delays(1.0, 8.0)
        for ceiling in (1, 2, 4, 8, 8, 8):
            self.assertBetween(next(delays), ceiling / 2, ceiling)


if __name__ == '__main__':
    absltest.main()
