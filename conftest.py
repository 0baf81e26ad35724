"""What the test files share: the repository's root, and train.py's config defaults."""
import os
import sys

from configurator import train_defaults  # noqa: F401 (imported from here by the test files)

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, 'experiments'))  # report.py, which the tests import
