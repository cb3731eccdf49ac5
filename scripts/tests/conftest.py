"""The scripts under test are plain files in scripts/: make them importable."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
