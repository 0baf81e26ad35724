"""What the test files share: the repository's root, and train.py's config defaults."""
import os

from configurator import train_defaults  # noqa: F401 (imported from here by the test files)

ROOT = os.path.dirname(os.path.abspath(__file__))
