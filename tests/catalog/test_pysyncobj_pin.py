"""The Raft catalog overrides pysyncobj's private methods: only the pinned release will do."""
import importlib
import inspect
import re
from importlib.metadata import version
from pathlib import Path

from catalog.raft.pysyncobj_pin import PRIVATE_NAMES, PYSYNCOBJ_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_pysyncobj_is_the_pinned_one():
    got = version("pysyncobj")
    assert got == PYSYNCOBJ_VERSION, (
        f"pysyncobj {got} is installed but the Raft catalog is written against {PYSYNCOBJ_VERSION}: "
        f"catalog/raft/wire.py overrides its private methods (see catalog/raft/pysyncobj_pin.py). "
        f"Install pysyncobj=={PYSYNCOBJ_VERSION} (make venv does) or port the overrides and bump the pin.")


def test_pyproject_pins_the_same_version():
    # the requirement lines only: [tool.mypy] names the module "pysyncobj" too
    deps = re.findall(r'^\s*"pysyncobj([^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert deps == [f"=={PYSYNCOBJ_VERSION}"], f"pyproject.toml must pin pysyncobj=={PYSYNCOBJ_VERSION}, has {deps}"


def test_every_private_name_the_catalog_relies_on_exists():
    missing = []
    for path, names in PRIVATE_NAMES.items():
        mod, cls_name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(mod), cls_name)
        src = inspect.getsource(cls)
        for n in names:
            mangled = n.startswith(f"_{cls_name}__")
            attr = f"self.__{n.split('__', 1)[1]} =" if mangled else f"self.{n} ="
            if not (hasattr(cls, n) or attr in src):
                missing.append(f"{path}.{n}")
    assert not missing, f"pysyncobj {version('pysyncobj')} lacks what the Raft catalog overrides: {missing}"
