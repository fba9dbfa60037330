"""``python -m policyport``: the policyport command line."""

from policyport.cli import main

main()
