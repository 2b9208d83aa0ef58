"""Settings of every test process.

torch runs on one thread in each test process (and, through OMP_NUM_THREADS, in the processes
tests start): pytest's workers already take every core (``-n auto``), the suite's tensors are
small (check's CI profile: 1 MiB an example), and a worker's idle pool threads spin on the cores
the other workers need. On a 2-core box with 2 workers, tests/testing/test_faults.py's
test_the_same_kernels_pass_without_faults took 19 s with torch's default (2 threads) and 8 s with
one. An OMP_NUM_THREADS set by the caller is kept.
"""
import os

_CALLER_SET = "OMP_NUM_THREADS" in os.environ
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not _CALLER_SET:
    torch.set_num_threads(1)
