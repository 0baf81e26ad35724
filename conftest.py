"""What the test files share: train.py's config defaults, read without running train.py."""
import dataclasses
import os

from configurator import collect_defaults
from model import ModelConfig

ROOT = os.path.dirname(os.path.abspath(__file__))


def train_defaults():
    """train.py's DEFAULTS: exec the block between its first two '# ---' lines (what it needs is passed in)."""
    with open(os.path.join(ROOT, 'train.py')) as f:
        head = f.read().split('\n# ' + '-' * 77 + '\n')[1]
    ns = {'dataclasses': dataclasses, 'ModelConfig': ModelConfig, 'collect_defaults': collect_defaults}
    exec(head, ns)
    return ns['DEFAULTS']
