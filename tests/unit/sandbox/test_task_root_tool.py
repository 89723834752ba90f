"""``python -m areal.tasks.root`` (a Debian root file system for a task's "root"): which packages
it installs for the sandbox's interpreter, and what it refuses before running debootstrap. The
debootstrap itself needs a mirror and minutes: docs/swe-tasks.md reports a run."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from areal.tasks import root


def test_the_interpreters_libraries_are_named_without_its_own_or_tkinters():
    libs = root.interpreter_libraries()
    assert any(os.path.basename(lib).startswith("libc.so") for lib in libs)
    prefix = os.path.realpath(sys.base_prefix) + "/"
    assert not any(os.path.realpath(lib).startswith(prefix) for lib in libs)  # libpython is bound in with the interpreter
    assert not any("libtk" in lib or "libX11" in lib for lib in libs)


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="not a Debian host")
def test_on_debian_each_library_maps_to_its_package():
    libs = root.interpreter_libraries()
    packages, missing = root.packages_of(libs)
    assert "libc6" in packages and missing == []


def test_a_directory_that_is_not_empty_is_refused_naming_it(tmp_path):
    (tmp_path / "keep").write_text("x")
    with pytest.raises(SystemExit, match=f"{tmp_path} exists and is not an empty directory"):
        root.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="keep exists and is not an empty directory"):
        root.main([str(tmp_path / "keep")])


def test_a_root_of_host_programs_holds_them_their_libraries_and_a_release_of_its_own(tmp_path):
    dest = tmp_path / "root"
    assert root.main([str(dest), "--from-host", "sh,cat"]) == 0
    assert os.path.exists(dest / "bin" / "sh") and os.path.exists(dest / "usr" / "bin" / "cat")
    libc = [lib for lib in root.interpreter_libraries() if os.path.basename(lib).startswith("libc.so")]
    assert libc and os.path.exists(str(dest) + os.path.realpath(libc[0]))
    assert (dest / "etc" / "os-release").read_text() == "areal-task-root\n"
    assert not os.path.exists(str(dest) + os.path.realpath(sys.executable))  # the sandbox binds the interpreter in
    with pytest.raises(SystemExit, match="programs not found on this host: \\['no-such-program-here'\\]"):
        root.main([str(tmp_path / "other"), "--from-host", "sh,no-such-program-here"])
