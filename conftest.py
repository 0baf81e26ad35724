"""What the test files (and bench.py) share: the repository's root, and train.py's defaults."""
import dataclasses
import os
import signal
import sys

from configurator import collect_defaults

ROOT = os.path.dirname(os.path.abspath(__file__))


def train_defaults():
    """train.py's config keys and defaults, read without running train.py: the block between its
    first two '# ---' lines, run with what it needs."""
    from model import ModelConfig
    with open(os.path.join(ROOT, "train.py")) as f:
        head = f.read().split("\n# " + "-" * 77 + "\n")[1]
    ns = {"dataclasses": dataclasses, "ModelConfig": ModelConfig,
          "collect_defaults": collect_defaults}
    exec(head, ns)
    return ns["DEFAULTS"]


def pytest_configure(config):
    # one torch thread in the test process, as OMP_NUM_THREADS=1 gives the scripts the tests run:
    # the tensors are tiny, and extra threads only add overhead (on a busy machine 40x: 300 tokens
    # of a tiny model took 7.7 s with 2 threads beside two training runs, 0.19 s with one)
    import torch
    torch.set_num_threads(1)


def signal_after_reader_gone(proc, sig, timeout):
    """Send sig to proc once the reader of its output pipe has gone (as `... | tee log` after the
    same Ctrl-C stopped tee): nothing it writes can arrive. Returns its exit status."""
    try:
        proc.send_signal(signal.SIGSTOP)  # the signal reaches it after the pipe's reader has gone
        proc.stdout.close()
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        return proc.wait(timeout=timeout)
    finally:
        proc.kill()


sys.path.insert(0, os.path.join(ROOT, 'experiments'))  # report.py, which the tests import
