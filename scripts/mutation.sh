#!/usr/bin/env bash
# Mutation testing (not part of CI): mutmut changes one operator, constant or call at a time in a
# group of modules and runs the tests that cover the changed function; a change no test notices
# ("survived") is a test missing. Each group runs in its own copy of the tree, .mutation/GROUP/,
# with only the tests that exercise it, so one group finishes in minutes to an hour on two cores.
#
#   scripts/mutation.sh                   every group, one after the other
#   scripts/mutation.sh compare cli       the groups named
#   scripts/mutation.sh --list            the groups, their modules and tests
#   MUTATION_CHILDREN=1 scripts/mutation.sh cli   one mutmut child at a time (default 2), on a shared machine
#   scripts/mutation.sh --sample 400 runtime      400 of the group's mutants drawn at random (--seed S, default 0):
#                                                 an estimate of the score where a full run takes hours
#   scripts/mutation.sh --resume converter        after adding tests: keep the last run's kills in functions
#                                                 unchanged since, check every other mutant again
#   scripts/mutation.sh --recheck converter-frameworks   check the timed-out mutants of the last run again, each
#                                                 in a fresh interpreter (every run does this at its end)
#
# Afterwards: .venv/bin/python scripts/mutation_report.py [GROUP...] prints killed/total per module
# and every surviving mutant; `cd .mutation/GROUP && ../../.venv/bin/mutmut show NAME` shows one.
# Mutants that cannot change behaviour are marked in the code with `# pragma: no mutate` and a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test,mutation
exec .venv/bin/python scripts/mutation_run.py "$@"
