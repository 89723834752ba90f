"""``python -m areal.trainer --config JOB.json`` (or under torchrun): one trainer rank."""

import sys

from areal.trainer.rank import main

sys.exit(main())
