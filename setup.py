"""The package layout, and the build of the optional C extension ``areal.ring._ringcopy`` (the ring
writer's hot path + XXH3-64).

pyproject.toml stays the metadata source; this file declares what it cannot: the packages, with
the run's YAMLs (the top-level ``conf/``) installed as ``areal/conf`` (``areal.config.conf_dir``
finds them there, or beside the package in a checkout and an editable install), and the
extension, which is ``optional``: on a machine without a C compiler ``pip install -e .`` still
succeeds and the ring falls back to its pure-Python path (and logs one warning);
``tests/unit/ring/test_ring_native.py`` fails when a compiler exists but the module did not
build. SIMD kernels are compiled per function with ``__attribute__((target))`` and chosen at
import by CPU feature checks, so no -march flag.
"""

from setuptools import Extension, find_namespace_packages, setup

setup(
    # Not `agents/`: that name belongs to the openai-agents SDK; example agents load by file path.
    packages=find_namespace_packages(include=["areal*", "sandbox*"]) + ["areal.conf"],
    package_dir={"areal.conf": "conf"},
    ext_modules=[
        Extension(
            "areal.ring._ringcopy",
            sources=["areal/ring/native/_ringcopy.c"],
            depends=["areal/ring/native/_xxh3.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ],
)
