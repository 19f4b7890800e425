#!/bin/sh
# Bazel coverage is not wired up offline; measure coverage with coverage.py.
echo "coverage unavailable: run coverage.py outside Bazel" >&2
exit 0
