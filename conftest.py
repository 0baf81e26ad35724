"""What the test files share: the repository's root, train.py's defaults (read
without torch), one torch thread, a signal sent after the reader of a pipe has gone."""
import os
import signal
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))


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
from configurator import train_defaults  # noqa: E402,F401 (the tests import it from here)
