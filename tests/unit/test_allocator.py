"""pipeline/allocator.py: malloc's thresholds, so a request's image buffers reuse pages instead of new ones."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from pipeline import allocator
from tests.helpers import ROOT

# One "request": four buffers of about a megabyte (an image, its PNG, the pipe's copy...), filled,
# then all freed at once, as a request's buffers are. Counts the minor page faults per request.
CHURN = textwrap.dedent(
    """
    import json, resource, sys
    from pipeline import allocator
    state = allocator.tune() if sys.argv[1] == "tune" else "default"
    sizes = (786_432, 1_048_576, 524_288, 1_310_720)
    patterns = [bytes([i % 251]) * n for i, n in enumerate(sizes)]

    def request():
        buffers = [bytearray(n) for n in sizes]
        for b, p in zip(buffers, patterns):
            b[:] = p  # touch every page
        del buffers

    for _ in range(20):
        request()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        request()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"state": state, "faults_per_request": faults / 200}))
    """
)


def _churn(mode: str, **env: str) -> dict[str, object]:
    import os

    environ = {k: v for k, v in os.environ.items() if k not in allocator.USER_SETTINGS and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode],
        cwd=ROOT,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_malloc_reuses_pages_where_the_default_faults_in_new_ones() -> None:
    default, tuned = _churn("default"), _churn("tune")
    assert default["state"] == "default" and tuned["state"] == "set"
    # glibc's defaults give a request's freed megabytes back to the kernel, so each request faults
    # its pages in anew (about 900 here: 3.5 MiB of 4 KiB pages); tuned, they are reused.
    assert float(default["faults_per_request"]) > 200, default
    assert float(tuned["faults_per_request"]) < 10, tuned


@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"},
        {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096:glibc.malloc.mmap_threshold=65536"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"MALLOC_TRIM_THRESHOLD_": "65536"},
    ],
)
def test_a_users_own_malloc_settings_win(env: dict[str, str]) -> None:
    assert allocator.user_has_settings(env)
    assert allocator.tune(env) == "user"


def test_other_tunables_are_not_malloc_settings() -> None:
    assert not allocator.user_has_settings({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"})
    assert not allocator.user_has_settings({})
