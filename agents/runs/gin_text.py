"""Gin configurations as text: the one place that reads, edits and writes it.

`gin.config_str` writes a configuration as statements (a binding and its indented continuation
lines); a stored configuration is compared, edited (a population member's from the
population's) and read back (the report's bindings) statement by statement. Values are written
as gin literals. `config_hash` names a configuration (or anything JSON) stably across runs,
machines and Python versions.
"""

import ast
import hashlib
import json
import tokenize

import gin
from gin import config_parser

from agents.storage import failures


def statements(config):
    """The statements of `config`, each a list of its lines (gin indents continuation lines)."""
    result = []
    for line in config.splitlines():
        if result and line[:1].isspace():
            result[-1].append(line)
        else:
            result.append([line])
    return result


def binding_name(binding):
    """The parameter `binding` ('scope/Name.parameter = value') sets."""
    return binding.split('=', 1)[0].strip()


def with_bindings(config, bindings, remove=()):
    """`config` (as `gin.config_str` writes it) with `bindings` ({'scope.name': value}) set,
    each in place of its statement if there is one, else added at the end, and the statements of
    `remove` dropped: e.g. the configuration of a population's member as a lone run's."""
    config_statements = statements(config)
    names = [binding_name(statement[0]) if '=' in statement[0] else None
             for statement in config_statements]
    lines = []
    for statement, name in zip(config_statements, names, strict=True):
        if name in remove:
            continue
        if name in bindings:
            statement = [f'{name} = {bindings[name]!r}']
        lines += statement
    lines += [f'{name} = {value!r}' for name, value in bindings.items() if name not in names]
    return '\n'.join(lines).rstrip('\n') + '\n'


def split_binding(config, name):
    """(the statements of `config` but its single binding of `name`, that binding's value);
    (None, None) without exactly one such binding or with a value that is no Python literal."""
    rest, values = [], []
    for statement in statements(config):
        key, equals, value = '\n'.join(statement).partition('=')
        if equals and key.strip() == name:
            values.append(value.replace('\\\n', ' '))
        else:
            rest.append(statement)
    if len(values) != 1:
        return None, None
    try:
        return rest, ast.literal_eval(values[0].strip())
    except (ValueError, SyntaxError):
        return None, None


def binding(name, value):
    """The gin statement binding `name` to the Python (or YAML) `value`."""
    return f'{name} = {literal(value)}'


def literal(value):
    """`value` as gin text: Python literals, except `@reference` and `%macro` strings."""
    if isinstance(value, str) and value[:1] in ('@', '%'):
        return value
    return repr(value)


def value(text):
    """The Python value of a binding's text, or the text itself if it is not a literal."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def parse_bindings(text):
    """`{'Configurable.parameter': value text}` of a gin file's bindings.

    Raises:
      ValueError: the text is not valid gin, naming the line.
    """
    lines = text.splitlines()
    parsed = []
    try:
        for statement in config_parser.ConfigParser(text, gin.config.ParserDelegate(True)):
            parsed.append(statement)
    except SyntaxError as error:
        raise ValueError(f'line {error.lineno}: cannot parse {(error.text or "").strip()!r}'
                         ) from error
    except tokenize.TokenError as error:
        message, (line, _) = error.args
        raise ValueError(f'line {line}: {message}') from error
    except Exception as error:  # Gin raises many types; all mean unusable gin.
        raise ValueError(failures.one_line(error)) from error
    starts = [statement.location.line_num for statement in parsed] + [len(lines) + 1]
    bindings = {}
    for statement, end in zip(parsed, starts[1:], strict=True):
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        name = '.'.join(part for part in (statement.selector, statement.arg_name) if part)
        if statement.scope:
            name = f'{statement.scope}/{name}'
        source = [line for line in lines[statement.location.line_num - 1:end - 1]
                  if line.strip() and not line.lstrip().startswith('#')]
        bindings[name] = ' '.join('\n'.join(source).split('=', 1)[1].split())
    return bindings


def config_hash(content, length):
    """The first `length` hex digits of the SHA-256 of `content` as JSON: the stable name of a
    configuration (its gin files and bindings), a population (its trials) or a report's
    configuration (its bindings but the seed)."""
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:length]
