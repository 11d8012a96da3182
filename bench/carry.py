"""The carry for the lent GPU machine: the wheels its bare image lacks, for Python 3.12 manylinux (issue 36 §6).

    python -m bench.carry            # fetch into .whl/ (git-ignored), then check
    python -m bench.carry --check    # check .whl/ only: complete, one version each, within the size limit

The device image holds torch 2.11, transformers 5.17 and the packages in ``ON_DEVICE`` (read from the
workplace's description of the image, 2026-11-17), and reaches no registry. What ``bench/gpu.sh``'s
steps import beyond them (diffusers, Gradio and its server stack, the PNG encoder) travels as wheels,
at the versions ``requirements*.txt`` pin: ``NEEDED`` and everything they require, found by reading
each wheel's ``Requires-Dist`` (markers evaluated for CPython 3.12 on Linux). The tree and the wheels
travel together under ``LIMIT_MIB``.

``docs/performance.md`` gives the one device call that installs them (``pip install --no-index
--no-deps --target``) and runs ``bench/gpu.sh``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".whl"
LIMIT_MIB = 64  # what travels with one call: the working tree and the carried paths together
# Pinned in requirements*.txt, or imported without being declared: Gradio imports pytz at import
# (gradio/components/datetime.py) and lists no pytz (it came with pandas < 3); the device's pandas is 3,
# without it: the 2026-12-04 device run's servers died at ``import gradio`` for want of it.
NEEDED = ("diffusers", "gradio", "gradio_client", "isal", "httptools", "pytz")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
_DEVICE_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click cloudpickle colorama contourpy cycler einops filelock fonttools frozenlist fsspec h11 h5py hf-xet httpcore httpx
huggingface-hub idna imageio jinja2 joblib kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl mpmath msgpack
multidict networkx ninja numpy nvidia-ml-py packaging pandas peft pillow pip pluggy prometheus-client propcache protobuf
psutil pyarrow pygments pyparsing python-dateutil pytz pyyaml regex requests rich safetensors scipy setuptools
shellingham six sympy tokenizers torch torchvision tqdm transformers triton typer typing-extensions urllib3 uvloop
werkzeug wheel wrapt yarl zipp
"""
ON_DEVICE = frozenset(canonicalize_name(n) for n in _DEVICE_IMAGE.split())
DEVICE_PYTHON: dict[str, str] = {
    **{k: str(v) for k, v in default_environment().items()},
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "platform_machine": "x86_64",
    "extra": "",
}


def pins() -> dict[str, str]:
    """name -> version, from the requirements files (``name==version`` lines)."""
    found: dict[str, str] = {}
    for path in ROOT.glob("requirements*.txt"):
        for line in path.read_text().splitlines():
            if m := re.match(r"\s*([A-Za-z0-9_.-]+)==([^\s;#]+)", line):
                found[canonicalize_name(m[1])] = m[2]
    return found


def carried(folder: Path = CARRY) -> dict[str, tuple[Version, Path]]:
    """The wheels in ``folder``: name -> (version, path)."""
    wheels: dict[str, tuple[Version, Path]] = {}
    for path in sorted(folder.glob("*.whl")):
        name, version, _build, _tags = parse_wheel_filename(path.name)
        if name in wheels:
            raise SystemExit(f"two versions of {name} in {folder}: {wheels[name][1].name} and {path.name}")
        wheels[name] = (version, path)
    return wheels


def requirements_of(wheel: Path) -> list[Requirement]:
    """What the wheel requires on the device (no extras; markers for CPython 3.12 on Linux)."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(DEVICE_PYTHON)]


def missing(folder: Path = CARRY) -> list[str]:
    """One line per requirement neither carried (at a version that satisfies it) nor on the device."""
    wheels = carried(folder)
    lines = [f"missing: {n} (a step imports it)" for n in map(canonicalize_name, NEEDED) if n not in wheels]
    for name, (_version, path) in wheels.items():
        for req in requirements_of(path):
            dep = canonicalize_name(req.name)
            if dep in ON_DEVICE:
                continue
            if dep not in wheels:
                lines.append(f"missing: {dep} ({req}), required by {name}")
            elif not req.specifier.contains(wheels[dep][0], prereleases=True):
                lines.append(f"wrong version: {dep} {wheels[dep][0]} carried, {name} requires {req}")
    return lines


def tree_mib() -> float:
    """The working tree that travels: tracked and untracked-but-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True)
    files = [ROOT / p for p in out.stdout.decode().split("\0") if p]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def fetch(spec: str, folder: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *platforms, "-d", str(folder), spec]  # fmt: skip
    subprocess.run(cmd, check=True)


def build(folder: Path = CARRY) -> None:
    """Fetch ``NEEDED`` at their pins, then whatever they require that neither the device nor the folder has."""
    folder.mkdir(exist_ok=True)
    versions = pins()
    for name in NEEDED:
        key = canonicalize_name(name)
        if key not in carried(folder):
            fetch(f"{name}=={versions[key]}" if key in versions else name, folder)
    while lines := [line for line in missing(folder) if line.startswith("missing: ")]:
        for line in lines:
            spec = re.match(r"missing: (\S+) \((.*?)\)", line)
            assert spec is not None
            if "required by" not in line:
                fetch(spec[1], folder)
                continue
            try:
                fetch(tested(Requirement(spec[2])), folder)
            except subprocess.CalledProcessError:  # no cp312 wheel of the version here: the newest that fits
                fetch(spec[2], folder)


def tested(req: Requirement) -> str:
    """The version installed here (the one the suite tests) where it satisfies ``req``, else ``req``."""
    try:
        here = version(req.name)
    except PackageNotFoundError:
        return str(req)
    return f"{req.name}=={here}" if req.specifier.contains(here, prereleases=True) else str(req)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the carry only; fetch nothing")
    args = parser.parse_args(argv)
    if not args.check:
        build()
    if not CARRY.is_dir():
        print(f"missing: the carry ({CARRY.name}/); run python -m bench.carry")
        return 1
    problems = missing()
    wheels_mib = sum(p.stat().st_size for _v, p in carried().values()) / 2**20
    total = wheels_mib + tree_mib()
    if total > LIMIT_MIB:
        problems.append(f"too large: the tree and the wheels are {total:.1f} MiB, over {LIMIT_MIB} MiB")
    for line in problems:
        print(line)
    print(f"carry: {len(carried())} wheels, {wheels_mib:.1f} MiB; with the tree {total:.1f} of {LIMIT_MIB} MiB")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
