#!/usr/bin/env bash
# Run the test suite (the README's second command; .ci/run calls it).
#
#   ./scripts/test.sh                 every test
#   ./scripts/test.sh -m "not slow"   extra arguments go to pytest
#   ./scripts/test.sh --all           the extended tier too (pytest -m extended: training runs
#                                     beyond CI's, which keeps each trainer's smoke and alignment
#                                     checks); a -m of yours replaces the default "not extended"
#
# The tests run on one pytest-xdist worker a core, at most DANCEGRPO_TEST_WORKERS (default 2;
# 0 runs them in this process).  A test file stays on one worker (--dist loadfile), in the order
# tests/conftest.py gives them (--no-loadscope-reorder: the files with training runs first, the
# short ones last to even out the end); the runs several files read are made once, on either
# worker (tests/shared_runs.py).
#
# Installs what the tests need first (./scripts/bootstrap.sh --deps-only --with
# diffusers-0.35, a no-op when up to date).  Tests that need the real upstream DanceGRPO
# fetch it from the locked URL
# (git's url.<base>.insteadOf mirrors apply) or from DANCEGRPO_SOURCE, and are skipped
# with the reason when it cannot be fetched; the count of those is printed at the end.
# Under CI (CI=true, as CI services set it) they fail instead: a CI run that skipped the
# tests of the port would pass without testing it (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DANCEGRPO_VENV:-$PWD/.venv}

# both dependency sets: the default (FLUX) and diffusers-0.35 (Wan2.1, Qwen-Image), whose tests
# run the trainers with it (docs/dependencies.md)
./scripts/bootstrap.sh --deps-only --with diffusers-0.35

mkdir -p build
results=build/test-results.xml
set +e
tier=(-m "not extended")
if [ "${1:-}" = "--all" ]; then
  shift
  tier=()
fi

max_workers=${DANCEGRPO_TEST_WORKERS:-2}
workers=$("$VENV/bin/python" -c "import os, sys; print(min(int(sys.argv[1]), len(os.sched_getaffinity(0))))" "$max_workers")
"$VENV/bin/python" -m pytest -p no:cacheprovider -n "$workers" --dist loadfile --no-loadscope-reorder --durations=25 --junitxml="$results" ${tier[@]+"${tier[@]}"} "$@"
status=$?
set -e

# The closing counts, with how many tests were skipped (or, under CI, failed) for lack of upstream.
"$VENV/bin/python" scripts/test_summary.py "$results" "$status"
if [ ${#tier[@]} -gt 0 ]; then
  echo "test.sh: the extended tier (pytest -m extended) was left out, as in CI; ./scripts/test.sh --all runs it"
fi

if [ "$status" -eq 5 ]; then
  echo "test.sh: error: pytest collected no tests; that is a failure, not a pass" >&2
  exit 1
fi
exit "$status"
