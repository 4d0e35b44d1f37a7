import ast
import numbers
import os
import shutil
import tempfile

import pytest
from xla_flags import use_test_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
use_test_flags()
os.environ.setdefault("MUJOCO_GL", "disable")

# CPython 3.11 can raise "SystemError: AST constructor recursion depth mismatch" from ast.parse
# when another thread converts an AST at the same time (gh-106905; the depth counter is shared by
# the interpreter). Tests read config docstrings with inspect.getsource (which calls ast.parse)
# and tyro parses them for --help; the failure is a race, so a retry parses the same source.
_ast_parse = ast.parse


def _parse_with_retry(*args, **kwargs):
    for _ in range(2):
        try:
            return _ast_parse(*args, **kwargs)
        except SystemError:
            pass
    return _ast_parse(*args, **kwargs)


ast.parse = _parse_with_retry

# One persistent XLA compilation cache per test session, shared by the pytest-xdist workers and
# the subprocesses tests start (they inherit the environment). Many tests compile the same
# program more than once: a run, then its resume (the interrupted, killed and resumed runs of
# the preemption tests recompile in every new process), and the single-seed runs a sweep is
# compared with. A cache hit loads the same executable XLA built, so results are unchanged
# (the bit-identical resume tests prove it on every run). Every program is stored, however fast
# it compiled (JAX's default keeps only those over a second): the many small ones (policies,
# evaluation, normalizers) recur across tests, and storing them took 3% less CPU time on four
# test files. A user's own JAX_COMPILATION_CACHE_DIR is kept and left in place.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="jaxrl-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure(config):
    """The session's compilation cache goes with the process that made it (the controller)."""
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture
def record_property(record_property):
    """pytest's ``record_property`` with numpy scalars stored as Python numbers.

    pytest-xdist sends recorded properties between processes and cannot serialize numpy types.
    """

    def record(name, value):
        if isinstance(value, numbers.Number) and not isinstance(value, bool | int | float):
            value = float(value)
        record_property(name, value)

    return record
