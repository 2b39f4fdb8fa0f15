"""The one import root: workbench, workbench.kernels, workbench.reference, editable and wheel."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_editable_import_maps_top_level_folders():
    import workbench.kernels
    import workbench.reference

    assert Path(workbench.kernels.__file__).parent == ROOT / "kernels"
    assert Path(workbench.reference.__file__).parent == ROOT / "reference"


def test_no_top_level_kernels_package_is_installed_by_us():
    # Hugging Face publishes a `kernels` package that transformers imports: we must not shadow it
    out = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                          "print(u.find_spec('kernels') is None or 'site-packages' in "
                          "str(u.find_spec('kernels').origin))"],
                         capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("how", ["cwd", "PYTHONPATH"])
def test_checkout_root_on_sys_path_shadows_nothing(how):
    # why: `python -m workbench` / `pytest` started in the checkout put its root first on
    # sys.path, where our kernels/ folder was the top-level `kernels` and broke transformers
    # (Hugging Face's `kernels`, "cannot import name 'CUDAProperties'"): the compressed-tensors
    # parity tests skipped on it. workbench moves the root behind the installed packages.
    import os

    code = ("import sys, importlib.util as u; import workbench, workbench.kernels; "
            "spec = u.find_spec('kernels'); "
            "print(spec is None or not spec.origin.startswith(sys.argv[1])); "
            "print(u.find_spec('workbench.kernels.int4_moe').origin.startswith(sys.argv[1]))")
    env = dict(os.environ)
    if how == "PYTHONPATH":
        env["PYTHONPATH"] = "."
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "kernels")], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


@pytest.mark.slow
def test_wheel_contains_every_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("ddtree_workbench-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, pkg in (("workbench", "workbench"), ("kernels", "workbench/kernels"),
                        ("reference", "workbench/reference")):
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT / folder).as_posix()
            assert f"{pkg}/{rel}" in names, f"{pkg}/{rel} missing: list it in pyproject packages"
    assert not any(n.startswith("kernels/") or n.startswith("reference/") for n in names)
    for src in (ROOT / "kernels").rglob("*.cu"):  # CUDA C++ compiled at run time (cupy NVRTC)
        rel = src.relative_to(ROOT / "kernels").as_posix()
        assert f"workbench/kernels/{rel}" in names, f"{rel} missing: list it in package-data"
