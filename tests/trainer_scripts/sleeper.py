"""A trainer without a save-on-signal: it records its pid, then trains (sleeps) for a while."""

import os
import sys
import time
from pathlib import Path

Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(60)
