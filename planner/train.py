"""``python -m planner.train``: the training entry point of the composed stack.

It lives in ``planner.runtime.train`` (it imports torch; the planner core never does); this module
only makes ``torchrun -m planner.train --plan plan.yaml --steps K`` work. See that module for the
options and the data-loader hook (``DataShard``, ``--data module:fn``).
"""

import sys

from planner.runtime.train import DataShard, app, cli, run, synthetic  # noqa: F401

if __name__ == "__main__":
    sys.exit(cli())
