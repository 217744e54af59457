"""The ingress fuzz tests (tests/security/test_sec_fuzz.py) with many more examples than
CI runs: ``python tests/fuzz_ingress.py [EXAMPLES]`` (default 300 per operation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    examples = sys.argv[1] if len(sys.argv) > 1 else "300"
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "THINKRAY_FUZZ_EXAMPLES": examples}
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "tests/security/test_sec_fuzz.py"]
    raise SystemExit(subprocess.call(cmd, cwd=repo, env=env))
