"""What the harness runs as root comes from where only root or its user could have put it, checked.

- The cache's trust (``toolchain.untrusted``, the gate ``toolchain.trusted``): a cached binary or image
  is refused, in one line naming the entry, its owner and mode and the fix, when it or any directory up
  to ``/`` belongs to another user or is writable by group or others (negative controls: a group-
  writable and a world-writable directory, a sticky world-writable cache, a directory, a binary and a
  symbolic link of uid 65534, a link into a world-writable directory); 0700 and 0755 directories of our
  own, and /tmp-like sticky directories above the cache, are accepted. ``Component.path``, ``ensure``
  and ``images.import_into`` go through the gate; the cache is created 0700 and its builds sealed
  whatever the umask.
- Go's checksum database cannot be switched off for the builds (GOSUMDB=off, GONOSUMDB, GOPRIVATE).
- The checker image's debootstrap checks signatures with the Debian archive keyring, or does not run:
  its command line, the one line a host without the keyring gets, and the signature its output must
  report (negative controls: debootstrap's output without a keyring, and with --no-check-gpg).

Pure: temporary directories, no build, no cluster; well under a second.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clusterproof.core.errors import HarnessError
from clusterproof.provision import hostpkgs, images, toolchain

OTHER = 65534   # nobody
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache root of our own, 0700, holding one built component; CLUSTERPROOF_CACHE points at it."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(root))
    toolchain.make_cache_root()
    d = toolchain.KWOK.directory
    d.mkdir(parents=True, mode=0o755)
    for b in toolchain.KWOK.binaries:
        (d / b).write_text("#!/bin/sh\n")
        (d / b).chmod(0o755)
    return root


def refused(path: Path, root: Path, *expected: str) -> str:
    why = toolchain.untrusted(path, root)
    assert why is not None, f"{path} was trusted"
    assert len(why.splitlines()) == 1, why
    for e in expected:
        assert e in why, why
    return why


def kwokctl(cache: Path) -> Path:
    return toolchain.KWOK.directory / "kwokctl"


# ---------------------------------------------------------------- accepted

@pytest.mark.parametrize("mode", [0o700, 0o755], ids=["0700", "0755"])
@pytest.mark.unit
def test_our_own_directories_are_trusted(cache, mode):
    cache.chmod(mode)
    assert toolchain.untrusted(kwokctl(cache), cache) is None
    assert toolchain.KWOK.path("kwokctl") == kwokctl(cache)


@pytest.mark.unit
def test_a_sticky_world_writable_directory_above_the_cache_is_trusted(tmp_path, monkeypatch):
    """/tmp's case: only an entry's owner (or the directory's, or root) may rename it there."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(shared / "cache"))
    toolchain.make_cache_root()
    assert toolchain.untrusted(shared / "cache" / "bin" / "x", shared / "cache") is None


@pytest.mark.unit
def test_a_link_to_a_directory_of_our_own_is_trusted(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(cache / "bin", elsewhere)
    shutil.rmtree(cache / "bin")
    (cache / "bin").symlink_to(elsewhere)
    assert toolchain.untrusted(kwokctl(cache), cache) is None


@pytest.mark.unit
def test_a_missing_binary_is_nothing_to_refuse(cache):
    assert toolchain.untrusted(toolchain.ETCD.directory / "etcd", cache) is None


# ---------------------------------------------------------------- refused

@pytest.mark.unit
def test_a_group_writable_cache_is_refused(cache):
    cache.chmod(0o775)
    refused(kwokctl(cache), cache, f"{cache} (owner ", "mode 0775", "writable by its group", "chmod go-w",
            "CLUSTERPROOF_CACHE")


@pytest.mark.unit
def test_a_world_writable_directory_in_the_cache_is_refused(cache):
    toolchain.KWOK.directory.chmod(0o777)
    refused(kwokctl(cache), cache, f"{toolchain.KWOK.directory} (owner ", "mode 0777", "its group and every user")


@pytest.mark.unit
def test_a_world_writable_directory_above_the_cache_is_refused(cache):
    cache.parent.chmod(0o777)
    try:
        refused(kwokctl(cache), cache, f"{cache.parent} (owner ", "every user")
    finally:
        cache.parent.chmod(0o700)


@pytest.mark.unit
def test_a_sticky_world_writable_cache_is_refused(cache):
    """Inside the cache the sticky bit is no excuse: anyone could add entries the harness would find."""
    cache.chmod(0o1777)
    refused(kwokctl(cache), cache, "mode 1777", "every user")


@pytest.mark.unit
def test_a_group_writable_binary_is_refused(cache):
    kwokctl(cache).chmod(0o775)
    refused(kwokctl(cache), cache, f"{kwokctl(cache)} (owner ", "mode 0775")


@as_root
@pytest.mark.unit
def test_a_directory_of_another_user_is_refused(cache):
    os.chown(cache, OTHER, OTHER)
    refused(kwokctl(cache), cache, f"{cache} (owner nobody, mode 0700) belongs to another user", "chown")


@as_root
@pytest.mark.unit
def test_a_binary_of_another_user_is_refused(cache):
    os.chown(kwokctl(cache), OTHER, OTHER)
    refused(kwokctl(cache), cache, f"{kwokctl(cache)} (owner nobody", "belongs to another user")


@as_root
@pytest.mark.unit
def test_a_link_of_another_user_is_refused(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(cache / "bin", elsewhere)
    (cache / "bin").symlink_to(elsewhere)
    os.lchown(cache / "bin", OTHER, OTHER)
    refused(kwokctl(cache), cache, f"{cache / 'bin'} (owner nobody", "belongs to another user")


@pytest.mark.unit
def test_a_link_into_a_world_writable_directory_is_refused(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(cache / "bin", elsewhere)
    (cache / "bin").symlink_to(elsewhere)
    elsewhere.chmod(0o777)
    refused(kwokctl(cache), cache, f"{elsewhere} (owner ", "every user")


# ---------------------------------------------------------------- the gate is on every way to run

@pytest.mark.unit
def test_component_path_and_ensure_refuse_an_untrusted_binary(cache):
    kwokctl(cache).chmod(0o777)
    with pytest.raises(HarnessError, match="kwokctl .*writable by its group and every user"):
        toolchain.KWOK.path("kwokctl")
    with pytest.raises(HarnessError, match="chmod go-w"):
        toolchain.ensure(toolchain.KWOK, progress=lambda m: pytest.fail(f"built something: {m}"))


@pytest.mark.unit
def test_an_untrusted_image_is_not_imported(cache):
    d = images.images_root() / "pause-0123456789ab"
    d.mkdir(parents=True)
    (d / "image.tar").write_bytes(b"")
    (d / "image.tar").chmod(0o666)
    built = images.Built("pause", "clusterproof.local/pause:0123456789ab", d / "image.tar", "sha256:0", "sha256:0",
                         0, ("sha256:0",))
    with pytest.raises(HarnessError, match=r"image\.tar \(owner .*mode 0666\) is writable by its group and every"):
        images.import_into(built, "/nonexistent.sock")


@pytest.mark.unit
def test_the_cache_is_made_0700_and_its_builds_sealed_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path / "cache"))
    old = os.umask(0o002)
    try:
        root = toolchain.make_cache_root()
        bin_ = toolchain.cache_dir("bin")
        staging = bin_ / "staging"
        staging.mkdir()
        (staging / "tool").write_text("")
        (staging / "tool").chmod(0o775)
    finally:
        os.umask(old)
    assert root.stat().st_mode & 0o777 == 0o700
    assert bin_.stat().st_mode & 0o777 == 0o755
    assert toolchain.untrusted(staging / "tool", root) is not None, "the control: a 0775 build output"
    toolchain.seal(staging)
    assert (staging / "tool").stat().st_mode & 0o777 == 0o755
    assert toolchain.untrusted(staging / "tool", root) is None


# ---------------------------------------------------------------- Go's checksum database

@pytest.mark.parametrize("goenv, named", [
    ({"GOSUMDB": "off"}, "GOSUMDB=off"),
    ({"GOSUMDB": "sum.golang.org", "GONOSUMDB": "k8s.io"}, "GONOSUMDB=k8s.io"),
    ({"GOSUMDB": "sum.golang.org", "GOPRIVATE": "*.corp.example"}, "GOPRIVATE=*.corp.example"),
], ids=["sumdb-off", "nosumdb", "private"])
@pytest.mark.unit
def test_modules_exempt_from_the_checksum_database_are_named(goenv, named):
    assert toolchain.unchecked_modules(goenv) == named


@pytest.mark.unit
def test_the_default_checksum_database_is_accepted():
    assert toolchain.unchecked_modules({"GOSUMDB": "sum.golang.org", "GONOSUMDB": "", "GOPRIVATE": ""}) is None


@pytest.mark.skipif(shutil.which("go") is None, reason="needs go")
@pytest.mark.unit
def test_a_build_with_the_checksum_database_off_is_one_line(monkeypatch):
    monkeypatch.setenv("GOSUMDB", "off")
    with pytest.raises(HarnessError, match=r"checksum database \(GOSUMDB=off\).*env -u NAME") as e:
        toolchain.go_binary()
    assert len(str(e.value).splitlines()) == 1


# ---------------------------------------------------------------- debootstrap's signatures

@pytest.mark.unit
def test_debootstrap_checks_signatures_with_the_debian_keyring(tmp_path):
    cmd = images.debootstrap_command(tmp_path / "rootfs")
    assert "--force-check-gpg" in cmd, cmd
    assert f"--keyring={images.KEYRING}" in cmd and images.KEYRING.name == "debian-archive-keyring.gpg", cmd
    assert "--no-check-gpg" not in cmd
    assert cmd[-3:] == [images.SUITE, str(tmp_path / "rootfs"), images.MIRROR]
    assert images.MIRROR.startswith("https://"), "no one on the way may serve an older signed Release"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounts a tmpfs: needs root and mount")
@pytest.mark.host
def test_debootstraps_mounts_keep_their_utab_off_the_host(tmp_path):
    """The mount command debootstrap runs writes its utab under the build's own directory, never the host's
    /run/mount (an x- option makes util-linux record the mount in utab, as debootstrap's may)."""
    env, point = images.debootstrap_env(tmp_path), tmp_path / "point"
    point.mkdir()
    had_run_mount = os.path.exists("/run/mount")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "x-clusterproof=1", "none", str(point)], env=env, check=True)
    try:
        assert str(point) in (tmp_path / "utab").read_text()
    finally:
        subprocess.run(["umount", str(point)], env=env, check=True)
    assert os.path.exists("/run/mount") == had_run_mount, "the mount command made /run/mount on the host"


@pytest.mark.unit
def test_a_host_without_the_keyring_is_one_line(tmp_path):
    with pytest.raises(HarnessError) as e:
        images.require_keyring(tmp_path / "no-keyring.gpg")
    line = str(e.value)
    assert len(line.splitlines()) == 1 and "no-keyring.gpg" in line, line
    assert "apt-get install debian-archive-keyring" in line, line


@pytest.mark.unit
def test_make_setup_installs_the_keyring_the_build_requires():
    assert images.KEYRING_PACKAGE in hostpkgs.PACKAGES


@pytest.mark.skipif(not images.KEYRING.is_file() or shutil.which("gpgv") is None, reason="no Debian keyring")
@pytest.mark.unit
def test_the_keyring_on_this_host_is_the_packaged_one():
    assert images.require_keyring() == images.KEYRING
    owner = subprocess.run(["dpkg-query", "-S", str(images.KEYRING)], capture_output=True, text=True)
    assert owner.stdout.startswith(f"{images.KEYRING_PACKAGE}:"), owner.stdout or owner.stderr


CHECKED = """I: Retrieving InRelease
I: Checking Release signature
I: Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)
I: Retrieving Packages
"""


@pytest.mark.unit
def test_the_base_records_the_key_that_signed_its_release():
    assert images.release_signature(CHECKED) == "4D64FEC119C2029067D6E791F8D2585B8783D481"


@pytest.mark.parametrize("output", [
    "W: Cannot check Release signature; keyring file not available /usr/share/keyrings/x.gpg\n"
    "I: Retrieving Packages \n",
    "I: Retrieving InRelease \nI: Retrieving Packages \n",
], ids=["keyring-missing-warning", "no-check-gpg"])
@pytest.mark.unit
def test_a_bootstrap_that_checked_no_signature_is_one_line(output, tmp_path):
    """The negative controls: what debootstrap prints without a keyring, or with --no-check-gpg."""
    with pytest.raises(HarnessError, match="no valid Release signature") as e:
        images.release_signature(output, tmp_path / "base.log")
    assert len(str(e.value).splitlines()) == 1 and "base.log" in str(e.value)


@pytest.mark.unit
def test_go_builds_spend_memory_for_cpu_unless_the_user_said_otherwise(monkeypatch):
    monkeypatch.delenv("GOGC", raising=False)
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    env = toolchain.go_env()
    assert (env["GOGC"], env["GOMEMLIMIT"]) == (toolchain.BUILD_GOGC, toolchain.BUILD_GOMEMLIMIT) == ("400", "4GiB")
    monkeypatch.setenv("GOGC", "100")
    assert toolchain.go_env()["GOGC"] == "100"       # the user's own setting is kept
