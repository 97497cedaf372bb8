"""Container images for real Kubernetes nodes, built on this machine as docker-archive tarballs.

Why build: no container registry is reachable from here (only deb.debian.org,
PyPI and the Go module proxy) and there is no Docker, yet a real node's
containerd needs two images that would normally be pulled:

* ``PAUSE``: the CRI sandbox image (containerd's ``sandbox_image``): one static
  binary ``/pause`` compiled from ``clusterproof/provision/pause.c``.
* ``CHECKER``: the GPU preflight checker, the local equivalent of
  ``clusterproof/preflight/checker/Dockerfile``: a ``debootstrap --variant=minbase`` Debian bookworm
  with its python3 (3.11), nvidia-ml-py at the pin of ``requirements.txt``, and
  the checker's sources at ``/app/preflight``; ``python -m preflight check``.

Each image is a docker-archive (``docker save``'s format, which ``ctr images
import`` reads): one ``layer.tar`` per layer, the image config (``rootfs.diff_ids``
are the sha256 of the uncompressed layer tars) and ``manifest.json`` with
``RepoTags``. Archives are cached under ``cache_root()/images`` keyed by a hash of
their inputs (sources, pins, tool versions, ``RECIPE``); the first 12 hex digits
of that key are the tag, so a second ``build`` finds the archive and builds
nothing. The checker's Debian base layer is cached separately (its key does not
involve the preflight sources), so editing the checker re-layers in seconds.

The node provides NVML, the image does not: like the NVIDIA container toolkit,
the node mounts its ``libnvidia-ml.so.1`` at ``/usr/lib/x86_64-linux-gnu/``.
pynvml calls ``dlopen("libnvidia-ml.so.1")``; Debian's ld.so searches its
multiarch directories (``/lib/x86_64-linux-gnu``, ``/usr/lib/x86_64-linux-gnu``)
as *system* directories after ``/etc/ld.so.cache``, so a library mounted there
after the image was built is found without being in the cache -- no ldconfig
entry is needed (and one made at build time could not list a file that is only
mounted at run time). ``_verify_loader`` proves this on every base build with a
stand-in library that is not in the cache.

Pinning by digest (containerd 1.6.20): ``import_into`` imports with
``--base-name <repository> --digests``, which makes containerd create a second
image record named ``<repository>@<manifest digest>`` next to the tag (without
``--digests`` only the tag exists and a digest reference does not resolve).
``manifest_digest`` is computed here the way containerd's docker-archive
importer writes its manifest (schema 2, uncompressed layers), and
``import_into`` fails if containerd's records name another digest.
tests/test_images.py checks, against a real containerd 1.6.20, that both
records exist, point at that digest, that the image is unpacked, and that
``ctr run <digest_ref>`` starts it. The CRI plugin resolves a pod's image by
exactly such a record name in namespace ``k8s.io`` (its image store caches
containerd's image records by name, ``ctr``-created ones included, and
``localResolve`` looks the normalized reference up there), so
``Built.digest_ref`` -- e.g. ``clusterproof.local/checker@sha256:...`` -- is a
valid pod image (imagePullPolicy Never/IfNotPresent) and ``sandbox_image``.
That last step is from containerd's source, not exercised here (no CRI client
on this machine). The tag and ``Built.image_id`` (the config digest, which CRI
also accepts as a reference) work as well.

Verified sources: debootstrap runs with ``--force-check-gpg`` and the Debian archive keyring named
(``--keyring``): it checks the Release file's signature, the package indices against the Release's
hashes and each package against the indices', or stops. A host without the keyring gets one line
naming the package to install (``require_keyring``), never debootstrap's warning and an unchecked
build. The mirror is https as well (no one on the way can serve an older, still validly signed,
Release). A cached archive or base layer is imported or reused only if no other user could have
replaced it (``toolchain.trusted``).

Reproducibility: the app and pause layers are byte-reproducible (fixed
mtimes/owners); the Debian base is not (debootstrap writes build-time files),
so the checker's tag and digest belong to one base build: build once and ship
the archive to the nodes rather than rebuilding per node.

Run ``python -m clusterproof.provision.images`` to build both (``--import SOCKET`` also
imports them into that containerd's ``k8s.io`` namespace).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from clusterproof.core import exitcodes, filelock
from clusterproof.core import progress as progress_lines
from clusterproof.core.errors import HarnessError
from clusterproof.core.processes import unmount_under
from clusterproof.core.timeparse import format_time, http_date
from clusterproof.provision import toolchain

PAUSE_SOURCE = Path(__file__).resolve().parent / "pause.c"
# The pause image's one history entry: part of its key, so an archive whose history names another path is
# never reused under a tag that a fresh build would give other bytes.
PAUSE_HISTORY = "COPY clusterproof/provision/pause.c (gcc -static -Os -s) /pause"
PREFLIGHT_DIR = Path(__file__).resolve().parent.parent / "preflight" / "checker"
PREFLIGHT_FILES = ("__init__.py", "__main__.py", "checker.py", "xids.py")

# Bumped when a recipe below changes (layout, config, stripping): part of every cache key.
RECIPE = "1"
REGISTRY = "clusterproof.local"
SUITE = "bookworm"            # Debian 12: python3 is 3.11, as python:3.11-slim
MIRROR = "https://deb.debian.org/debian"
# The keys debootstrap checks the Release signature with (package debian-archive-keyring, pinned in
# clusterproof.provision.hostpkgs). Named explicitly: debootstrap's own default is found by its suite script.
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
KEYRING_PACKAGE = "debian-archive-keyring"
NVML_DIR = "/usr/lib/x86_64-linux-gnu"   # where the node's libnvidia-ml.so.1 is mounted
SITE_DIR = "usr/lib/python3/dist-packages"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EPOCH = 0                     # mtime of the files this module writes: same inputs, same layer digest

# Media types of the manifest containerd 1.6's docker-archive importer writes
# (images/archive/importer.go: schema 2, uncompressed layers unless --compress-blobs).
MT_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_CONFIG = "application/vnd.docker.container.image.v1+json"
MT_LAYER = "application/vnd.docker.image.rootfs.diff.tar"


@dataclass(frozen=True)
class Image:
    name: str          # repository is REGISTRY/name
    what: str


PAUSE = Image("pause", "CRI sandbox image (clusterproof/provision/pause.c)")
CHECKER = Image("checker", "GPU preflight checker (python -m preflight check)")
IMAGES = (PAUSE, CHECKER)


@dataclass(frozen=True)
class Built:
    """A built image archive (from the cache or just built)."""
    name: str                       # "pause" | "checker"
    ref: str                        # tag: clusterproof.local/<name>:<hash12 of the inputs>
    tar: Path                       # the docker-archive
    config_digest: str              # sha256:... of the image config = the image id
    manifest_digest: str            # sha256:... of the manifest containerd writes on import
    size: int                       # bytes of the archive
    diff_ids: tuple[str, ...]       # sha256 of each uncompressed layer, base first
    labels: dict = field(default_factory=dict, compare=False)
    cached: bool = False            # True: found in the cache, nothing was built

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def digest_ref(self) -> str:
        """``<repository>@<manifest digest>``: resolves in containerd once ``import_into`` ran."""
        return f"{self.repository}@{self.manifest_digest}"

    @property
    def image_id(self) -> str:
        """What CRI reports as the image id (and accepts as a reference)."""
        return self.config_digest

    @property
    def chain_id(self) -> str:
        """The snapshot name of the unpacked top layer (OCI ChainID of diff_ids)."""
        chain = self.diff_ids[0]
        for d in self.diff_ids[1:]:
            chain = "sha256:" + hashlib.sha256(f"{chain} {d}".encode()).hexdigest()
        return chain


# ---------------------------------------------------------------- helpers

def images_root() -> Path:
    return toolchain.cache_root() / "images"


def _images_dir() -> Path:
    """``images_root()``, created (0755 at most) under a cache root that is ``toolchain.trusted``."""
    return toolchain.cache_dir("images")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _run(cmd: list[str], log: Path | None, what: str, fix: str, timeout: float = 1800, **kw) -> str:
    """Run ``cmd``; output appended to ``log`` (or returned); a failure is one HarnessError line."""
    try:
        with progress_lines.heartbeat(f"{what} ({os.path.basename(cmd[0])})", timeout=timeout):
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=timeout, **kw)
    except FileNotFoundError:
        raise HarnessError(f"{what}: {cmd[0]} not found: install it or put it on PATH") from None
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{what}: {cmd[0]} did not finish in {timeout:.0f} s; {fix}") from None
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{p.stdout}\n")
    if p.returncode != 0:
        tail = (p.stdout.strip().splitlines() or [""])[-1][:200]
        where = f"log: {log}" if log is not None else f"last line: {tail}"
        raise HarnessError(f"{what} failed (exit {p.returncode}; {where}); {fix}")
    return p.stdout


def _need(tool: str, fix: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise HarnessError(f"no {tool} on PATH: {fix}")
    return path


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise HarnessError(f"{what} needs root (debootstrap, chroot, file ownership in the layers): "
                           f"run as root, e.g. sudo {sys.executable} -m clusterproof.provision.images")


def _remove_tree(path: Path) -> None:
    if path.exists():
        unmount_under(path)
        shutil.rmtree(path, ignore_errors=True)


def _lock():
    """One build at a time per cache (two test sessions must not both debootstrap)."""
    return filelock.held(_images_dir() / ".lock")


def _tarinfo(name: str, *, type_=tarfile.REGTYPE, mode=0o644, size=0, linkname="") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.linkname = type_, mode, size, linkname
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = EPOCH
    return ti


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    tf.addfile(_tarinfo(name, mode=mode, size=len(data)), io.BytesIO(data))


def _write_layer_from_tree(tree: Path, out: Path, skip_contents: tuple[str, ...] = ()) -> None:
    """A layer tar of ``tree`` (sorted, numeric owners, hard links kept); the directories in
    ``skip_contents`` are kept but not what is inside them (/dev, /proc, ... of a rootfs)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(tree):
            rel = os.path.relpath(dirpath, tree)
            dirnames.sort()
            if rel in skip_contents:
                dirnames[:] = []
                filenames = []
            for name in [*sorted(filenames), *dirnames]:
                full = os.path.join(dirpath, name)
                arc = name if rel == "." else f"{rel}/{name}"
                ti = tf.gettarinfo(full, arc)
                if ti is None:       # sockets: nothing a layer can hold
                    continue
                ti.uname = ti.gname = ""
                ti.mtime = int(ti.mtime)
                if ti.isreg():
                    with open(full, "rb") as f:
                        tf.addfile(ti, f)
                else:
                    tf.addfile(ti)


def _docker_config(diff_ids: list[str], config: dict, created: str, history: list[str]) -> bytes:
    body = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": created, "created_by": h} for h in history],
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _containerd_manifest(config_digest: str, config_size: int, layers: list[tuple[str, int]]) -> bytes:
    """The manifest containerd 1.6's docker-archive importer writes (Go json.Marshal of its
    struct: this field order, no spaces); its digest is the image's digest in containerd."""
    def desc(mt: str, digest: str, size: int) -> str:
        return f'{{"mediaType":"{mt}","digest":"{digest}","size":{size}}}'
    return ('{"schemaVersion":2,"mediaType":"%s","config":%s,"layers":[%s]}' % (
        MT_MANIFEST, desc(MT_CONFIG, config_digest, config_size),
        ",".join(desc(MT_LAYER, d, s) for d, s in layers))).encode()


def _write_archive(name: str, key: str, layer_tars: list[Path], config: dict, created: str,
                   history: list[str], labels: dict, progress) -> Built:
    """Assemble the docker-archive of an image into its cache directory (atomically)."""
    ref = f"{REGISTRY}/{name}:{key[:12]}"
    layers = [(_sha256_file(t), t.stat().st_size) for t in layer_tars]
    diff_ids = [d for d, _ in layers]
    config = {**config, "Labels": labels}
    cfg = _docker_config(diff_ids, config, created, history)
    cfg_digest = "sha256:" + hashlib.sha256(cfg).hexdigest()
    manifest = _containerd_manifest(cfg_digest, len(cfg), layers)
    out = images_root() / f"{name}-{key[:12]}"
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=images_root()))
    try:
        tar = staging / "image.tar"
        with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
            layer_names = []
            for (digest, _), path in zip(layers, layer_tars):
                hex_ = digest.split(":", 1)[1]
                tf.addfile(_tarinfo(hex_, type_=tarfile.DIRTYPE, mode=0o755))
                ti = _tarinfo(f"{hex_}/layer.tar", size=path.stat().st_size)
                with open(path, "rb") as f:
                    tf.addfile(ti, f)
                layer_names.append(f"{hex_}/layer.tar")
            cfg_name = cfg_digest.split(":", 1)[1] + ".json"
            _add_bytes(tf, cfg_name, cfg)
            _add_bytes(tf, "manifest.json", json.dumps(
                [{"Config": cfg_name, "RepoTags": [ref], "Layers": layer_names}]).encode())
        built = Built(name, ref, out / "image.tar", cfg_digest,
                      "sha256:" + hashlib.sha256(manifest).hexdigest(), tar.stat().st_size,
                      tuple(diff_ids), labels)
        (staging / "built.json").write_text(json.dumps(
            {"name": name, "ref": ref, "config_digest": built.config_digest,
             "manifest_digest": built.manifest_digest, "size": built.size, "diff_ids": diff_ids,
             "labels": labels, "key": key}, indent=1))
        toolchain.seal(staging)
        _remove_tree(out)
        staging.rename(out)
    finally:
        _remove_tree(staging)
    progress(f"built {ref} ({built.size / 1e6:.1f} MB, {built.config_digest[:19]})")
    return built


def _cached(name: str, key: str) -> Built | None:
    d = images_root() / f"{name}-{key[:12]}"
    try:
        meta = json.loads((d / "built.json").read_text())
        if meta["key"] != key or (d / "image.tar").stat().st_size != meta["size"]:
            return None
    except (OSError, ValueError, KeyError):
        return None
    toolchain.trusted(d / "built.json")
    return Built(name, meta["ref"], toolchain.trusted(d / "image.tar"), meta["config_digest"], meta["manifest_digest"],
                 meta["size"], tuple(meta["diff_ids"]), meta["labels"], cached=True)


def _logs() -> Path:
    d = _images_dir() / "logs"
    d.mkdir(mode=0o755, exist_ok=True)
    return d


# ---------------------------------------------------------------- pause

def _gcc_inputs() -> dict:
    gcc = _need("gcc", "apt-get install gcc libc6-dev (the pause binary is compiled here)")
    version = _run([gcc, "--version"], None, "gcc --version", "reinstall gcc").splitlines()[0]
    libc = _run(["ldd", "--version"], None, "ldd --version", "apt-get install libc-bin").splitlines()[0]
    return {"gcc": version, "libc": libc}


def _pause_inputs() -> dict:
    if not PAUSE_SOURCE.is_file():
        raise HarnessError(f"{PAUSE_SOURCE} is missing: restore it from git "
                           "(git checkout -- clusterproof/provision/pause.c)")
    return {"recipe": RECIPE, "image": "pause", "source": hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest(),
            "history": PAUSE_HISTORY, **_gcc_inputs()}


def compile_pause(out: Path, log: Path | None = None) -> Path:
    """``gcc -static -Os -s`` of clusterproof/provision/pause.c into ``out``."""
    _run(["gcc", "-static", "-Os", "-s", "-Wall", "-o", str(out), str(PAUSE_SOURCE)], log,
         "compiling clusterproof/provision/pause.c", "install gcc and static glibc (apt-get install gcc libc6-dev)")
    return out


def _build_pause(key: str, inputs: dict, progress) -> Built:
    log = _logs() / f"pause-{key[:12]}.log"
    log.write_text("")
    progress(f"building {REGISTRY}/pause:{key[:12]} (gcc -static; log: {log})")
    with tempfile.TemporaryDirectory(prefix="cp-pause-") as work:
        binary = compile_pause(Path(work) / "pause", log)
        layer = Path(work) / "layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tf:
            with open(binary, "rb") as f:
                tf.addfile(_tarinfo("pause", mode=0o755, size=binary.stat().st_size), f)
        labels = {"org.opencontainers.image.title": "clusterproof pause",
                  "clusterproof.recipe": RECIPE, "clusterproof.gcc": inputs["gcc"], "clusterproof.libc": inputs["libc"],
                  "clusterproof.why": "no registry reachable: the CRI sandbox image is built here"}
        # As registry.k8s.io/pause: the sandbox runs as 65535, not root.
        config = {"Entrypoint": ["/pause"], "Env": [PATH_ENV], "WorkingDir": "/", "User": "65535:65535"}
        return _write_archive("pause", key, [layer], config, "1970-01-01T00:00:00Z",
                              [PAUSE_HISTORY], labels, progress)


# ---------------------------------------------------------------- checker

def nvidia_ml_py_pin() -> str:
    """The nvidia-ml-py version installed beside the harness (pinned by the lock, requirements.txt)."""
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        raise HarnessError("nvidia-ml-py is not installed: pip install clusterproof (it depends on it)") from None


def debootstrap_version() -> str:
    _need("debootstrap", "apt-get install debootstrap (the checker image's Debian base is bootstrapped here)")
    out = _run(["debootstrap", "--version"], None, "debootstrap --version", "reinstall debootstrap")
    return out.strip().split()[-1]


def require_keyring(keyring: Path = KEYRING) -> Path:
    """The Debian archive keyring, or one line saying what to install: without it debootstrap cannot check
    what it downloads (and by default would only warn, then install it unchecked)."""
    if not keyring.is_file():
        raise HarnessError(f"no Debian archive keyring at {keyring}, which debootstrap checks the packages of "
                           f"the checker image with: apt-get install {KEYRING_PACKAGE} (as root; or `make setup`)")
    _need("gpgv", "apt-get install gpgv (debootstrap checks the Debian Release signature with it)")
    return keyring


def debootstrap_env(staging: Path) -> dict[str, str]:
    """debootstrap's environment. ``LIBMOUNT_UTAB``: the mount and umount commands it runs (proc and sys in
    the chroot) keep their utab in ``staging``, not in the host's ``/run/mount`` -- which util-linux would
    otherwise create, and which a cold machine's set-up left on the host (fresh-clone CI, 2026-11-28)."""
    return {**os.environ, "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive",
            "LIBMOUNT_UTAB": str(staging / "utab")}


def debootstrap_command(rootfs: Path, keyring: Path = KEYRING) -> list[str]:
    """The bootstrap of the checker's Debian base: signatures checked with ``keyring`` or no build at all
    (``--force-check-gpg``: without it a missing keyring is a warning and the packages go unchecked)."""
    return ["debootstrap", "--force-check-gpg", f"--keyring={keyring}", "--variant=minbase", "--include=python3",
            SUITE, str(rootfs), MIRROR]


def release_signature(output: str, log: Path | None = None) -> str:
    """The key that signed the Release file, from debootstrap's output ("I: Valid Release signature (key id
    <fingerprint>)"): the proof that the check ran, not only that it was asked for. None there: one line."""
    m = re.search(r"^I: Valid Release signature \(key id ([0-9A-F]+)\)", output, flags=re.M)
    if m is None:
        where = f" (log: {log})" if log else ""
        raise HarnessError(f"debootstrap reported no valid Release signature{where}: the Debian base is not "
                           "used unchecked; see debootstrap's lines about the signature")
    return m[1]


def _base_inputs() -> dict:
    # "keyring" (and the https mirror): a base cached before its signatures were checked is never reused.
    return {"recipe": RECIPE, "suite": SUITE, "mirror": MIRROR, "variant": "minbase", "include": "python3",
            "debootstrap": debootstrap_version(), "keyring": str(KEYRING)}


# Removed from the Debian base: caches, package lists, docs (copyright files stay), man pages,
# translations, logs. The image needs no apt at run time.
_STRIP = ("var/cache/apt", "var/lib/apt/lists", "usr/share/man", "usr/share/info", "usr/share/locale",
          "usr/share/lintian", "usr/share/linda", "var/cache/debconf", "var/log")
_EMPTY_DIRS = ("dev", "proc", "sys", "tmp", "run", "var/tmp", "mnt", "media")


def _strip_rootfs(rootfs: Path) -> None:
    for rel in _STRIP:
        d = rootfs / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for doc in (rootfs / "usr/share/doc").glob("*"):
        if doc.is_dir() and not doc.is_symlink():
            for f in doc.iterdir():
                if f.name != "copyright":
                    shutil.rmtree(f) if f.is_dir() and not f.is_symlink() else f.unlink()
    for host_file in ("etc/resolv.conf", "etc/hostname"):   # debootstrap copies the build host's
        p = rootfs / host_file
        if p.exists() or p.is_symlink():
            p.unlink()
    (rootfs / "etc/hostname").write_text("")
    for rel in ("var/lib/dpkg/status-old", "var/lib/dpkg/diversions-old", "var/cache/ldconfig/aux-cache"):
        p = rootfs / rel
        if p.exists():
            p.unlink()


def _verify_loader(rootfs: Path, work: Path, log: Path) -> None:
    """Prove that dlopen("libnvidia-ml.so.1") in this rootfs finds a library placed in NVML_DIR
    after ld.so.cache was made (the node mounts it at run time): a stand-in built with gcc,
    loaded by the rootfs's own python3, then removed."""
    stub_src = work / "stub.c"
    stub_src.write_text("int clusterproof_nvml_stub(void) { return 42; }\n")
    target = rootfs / NVML_DIR.lstrip("/") / "libnvidia-ml.so.1"
    if target.exists():
        raise HarnessError(f"the Debian base ships {target.name} at {NVML_DIR}: the node's mount would hide it; "
                           f"bump RECIPE after checking the package list (log: {log})")
    _run(["gcc", "-shared", "-fPIC", "-o", str(target), str(stub_src)], log, "building a stand-in libnvidia-ml.so.1",
         "install gcc")
    try:
        probe = ("import ctypes; lib = ctypes.CDLL('libnvidia-ml.so.1'); "
                 "assert lib.clusterproof_nvml_stub() == 42; print('dlopen ok')")
        _run([_need("chroot", "install coreutils"), str(rootfs), "/usr/bin/python3", "-c", probe], log,
             "loading libnvidia-ml.so.1 from the checker base", "the image's loader does not search "
             f"{NVML_DIR}: add an /etc/ld.so.conf.d entry and run ldconfig at run time",
             env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    finally:
        target.unlink()


def _release_info(rootfs: Path) -> dict:
    """Date and version of the Debian release the base was bootstrapped from (its Release file)."""
    lists = rootfs / "var/lib/apt/lists"
    info = {}
    for f in lists.glob("*_Release"):
        for line in f.read_text(errors="replace").splitlines():
            k, _, v = line.partition(":")
            if k in ("Date", "Version", "Suite", "Codename") and k not in info:
                info[k] = v.strip()
    return info


def _packages(rootfs: Path, log: Path) -> dict[str, str]:
    out = _run(["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${Package}\t${Version}\n"],
               log, "listing the base's packages", "install dpkg")
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def _base_dir(key: str) -> Path:
    return images_root() / f"base-{SUITE}-{key[:12]}"


def _ensure_base(progress) -> dict:
    """The Debian bookworm minbase + python3 layer (cached under images/base-<key12>)."""
    inputs = _base_inputs()
    key = _key(inputs)
    out = _base_dir(key)
    try:
        meta = json.loads((out / "base.json").read_text())
        if (out / "layer.tar").stat().st_size == meta["size"]:
            toolchain.trusted(out / "base.json")
            toolchain.trusted(out / "layer.tar")
            return meta
    except (OSError, ValueError, KeyError):
        pass
    log = _logs() / f"base-{SUITE}-{key[:12]}.log"
    log.write_text("")
    progress(f"bootstrapping Debian {SUITE} (minbase + python3) from {MIRROR} for the checker image, "
             f"signatures checked with {KEYRING} (first run only; log: {log})")
    staging = Path(tempfile.mkdtemp(prefix=".base-", dir=images_root()))
    try:
        rootfs = staging / "rootfs"
        said = _run(debootstrap_command(rootfs, require_keyring()), log,
                    f"debootstrap {SUITE}", f"check that {MIRROR} is reachable and its signatures valid (see the log)",
                    env=debootstrap_env(staging))
        signed_by = release_signature(said, log)
        unmount_under(rootfs)
        release = _release_info(rootfs)
        packages = _packages(rootfs, log)
        if "python3" not in packages:
            raise HarnessError(f"debootstrap {SUITE} installed no python3 (log: {log}); bump RECIPE after fixing")
        _strip_rootfs(rootfs)
        _verify_loader(rootfs, staging, log)
        layer = staging / "layer.tar"
        _write_layer_from_tree(rootfs, layer, skip_contents=_EMPTY_DIRS)
        shutil.rmtree(rootfs)
        meta = {"key": key, "inputs": inputs, "diff_id": _sha256_file(layer), "size": layer.stat().st_size,
                "release": release, "signed_by": signed_by, "python3": packages["python3"], "packages": packages,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (staging / "base.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        toolchain.seal(staging)
        _remove_tree(out)
        staging.rename(out)
    finally:
        _remove_tree(staging)
    progress(f"Debian base {release.get('Version', '?')} ({release.get('Date', '?')}): "
             f"{meta['size'] / 1e6:.1f} MB layer")
    return meta


def _checker_inputs(base: dict) -> dict:
    files = {}
    for name in PREFLIGHT_FILES:
        p = PREFLIGHT_DIR / name
        if not p.is_file():
            raise HarnessError(f"{p} is missing: the checker image needs preflight/{name} (restore it from git)")
        files[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return {"recipe": RECIPE, "image": "checker", "base": base["key"], "base_diff_id": base["diff_id"],
            "nvidia-ml-py": nvidia_ml_py_pin(), "files": files}


def _checker_preconditions() -> None:
    _need_root("building the checker image")
    debootstrap_version()
    require_keyring()
    _need("gcc", "apt-get install gcc (a stand-in libnvidia-ml.so.1 verifies the image's loader)")


def _pip_install(pin: str, target: Path, log: Path) -> None:
    _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--no-compile",
          "--only-binary=:all:", "--target", str(target), f"nvidia-ml-py=={pin}"], log,
         f"pip install nvidia-ml-py=={pin}", "check that PyPI is reachable and the pin in requirements.txt exists")


def _app_layer(pin: str, work: Path, out: Path, log: Path) -> None:
    """The checker's own layer: python symlink, nvidia-ml-py, /app/preflight (deterministic tar)."""
    site = work / "site"
    _pip_install(pin, site, log)
    dirs = ["app", "app/preflight", "usr", "usr/local", "usr/local/bin", "usr/lib", "usr/lib/python3", SITE_DIR]
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for d in dirs:
            tf.addfile(_tarinfo(d, type_=tarfile.DIRTYPE, mode=0o755))
        # Debian ships only python3; the pod command is `python -m preflight check`.
        tf.addfile(_tarinfo("usr/local/bin/python", type_=tarfile.SYMTYPE, mode=0o777, linkname="/usr/bin/python3"))
        for name in PREFLIGHT_FILES:
            _add_bytes(tf, f"app/preflight/{name}", (PREFLIGHT_DIR / name).read_bytes())
        for path in sorted(site.rglob("*")):
            rel = path.relative_to(site).as_posix()
            if "__pycache__" in rel or rel.startswith("bin"):
                continue
            if path.is_dir():
                tf.addfile(_tarinfo(f"{SITE_DIR}/{rel}", type_=tarfile.DIRTYPE, mode=0o755))
            else:
                _add_bytes(tf, f"{SITE_DIR}/{rel}", path.read_bytes())


def _build_checker(key: str, inputs: dict, base: dict, progress) -> Built:
    log = _logs() / f"checker-{key[:12]}.log"
    log.write_text("")
    pin = inputs["nvidia-ml-py"]
    progress(f"building {REGISTRY}/checker:{key[:12]} (nvidia-ml-py=={pin} + preflight; log: {log})")
    release = base["release"]
    date = release.get("Date", "")
    released = http_date(date)
    created = format_time(released) if released else "1970-01-01T00:00:00Z"
    with tempfile.TemporaryDirectory(prefix="cp-checker-") as work:
        layer = Path(work) / "app.tar"
        _app_layer(pin, Path(work), layer, log)
        labels = {
            "org.opencontainers.image.title": "clusterproof preflight checker",
            "clusterproof.recipe": RECIPE,
            "clusterproof.equivalent-of": "clusterproof/preflight/checker/Dockerfile",
            "clusterproof.debootstrap": base["inputs"]["debootstrap"],
            "clusterproof.debian.suite": SUITE,
            "clusterproof.debian.mirror": MIRROR,
            "clusterproof.debian.verified": f"debootstrap --force-check-gpg --keyring={KEYRING}: Release signed "
                                            f"by {base['signed_by']}",
            # deb.debian.org is no snapshot archive: the Release file's date identifies the package set.
            "clusterproof.debian.release": release.get("Version", ""),
            "clusterproof.debian.release-date": date,
            "clusterproof.debian.bootstrapped": base["built"],
            "clusterproof.python3": base["python3"],
            "clusterproof.python": "/usr/local/bin/python -> /usr/bin/python3 (Debian has only python3; "
                                   "the pod command is python -m preflight check)",
            "clusterproof.nvidia-ml-py": pin,
            "clusterproof.nvml": f"not in the image: the node mounts libnvidia-ml.so.1 at {NVML_DIR} "
                                 "(found by the loader's system search path, no ldconfig needed)",
        }
        config = {"Cmd": ["python", "-m", "preflight", "check"], "WorkingDir": "/app",
                  "Env": [PATH_ENV, "LANG=C.UTF-8", "PYTHONPATH=/app", "NVIDIA_VISIBLE_DEVICES=all",
                          "NVIDIA_DRIVER_CAPABILITIES=utility"]}
        history = [f"debootstrap --force-check-gpg --keyring={KEYRING} --variant=minbase --include=python3 "
                   f"{SUITE} / {MIRROR} "
                   f"(debootstrap {base['inputs']['debootstrap']}, Release {date}; apt lists, docs stripped)",
                   f"pip install nvidia-ml-py=={pin}; "
                   f"COPY clusterproof/preflight/checker/{{{','.join(PREFLIGHT_FILES)}}} /app/preflight/; "
                   "ln -s /usr/bin/python3 /usr/local/bin/python"]
        return _write_archive("checker", key, [_base_dir(base["key"]) / "layer.tar", layer], config,
                              created, history, labels, progress)


# ---------------------------------------------------------------- API

def build(image: Image = CHECKER, progress=progress_lines.say) -> Built:
    """The docker-archive of ``image`` (PAUSE or CHECKER), from the cache when its inputs did not change."""
    if image == PAUSE:
        inputs = _pause_inputs()
        key = _key(inputs)
        hit = _cached("pause", key)
        if hit:
            return hit
        with _lock():
            return _cached("pause", key) or _build_pause(key, inputs, progress)
    if image == CHECKER:
        _checker_preconditions()
        with _lock():
            base = _ensure_base(progress)
            inputs = _checker_inputs(base)
            key = _key(inputs)
            return _cached("checker", key) or _build_checker(key, inputs, base, progress)
    raise HarnessError(f"unknown image {image!r}: use clusterproof.provision.images.PAUSE "
                       "or clusterproof.provision.images.CHECKER")


def _ctr(address: str, namespace: str, *args: str, timeout: float = 600) -> str:
    return _run(["ctr", "--address", address, "-n", namespace, *args], None, f"ctr {' '.join(args[:2])}",
                "check that containerd runs and listens on that socket", timeout=timeout)


def image_records(address: str, namespace: str = "k8s.io") -> dict[str, str]:
    """containerd's image records in ``namespace``: name -> target (manifest) digest."""
    out = _ctr(address, namespace, "images", "ls")
    records = {}
    for line in out.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3:
            records[cols[0]] = cols[2]
    return records


def import_into(built: Built, containerd_address: str, namespace: str = "k8s.io",
                snapshotter: str = "overlayfs") -> tuple[str, str]:
    """Import ``built`` into the containerd at ``containerd_address`` (namespace ``k8s.io``: the one
    CRI, hence the kubelet, sees), unpacked for ``snapshotter`` so the first pod starts without
    unpacking; returns (tag, digest ref), both verified to resolve to the predicted manifest."""
    if not built.tar.is_file():
        raise HarnessError(f"{built.tar} is gone: build the image again (python -m clusterproof.provision.images)")
    toolchain.trusted(built.tar)   # what containerd then runs, as root
    _need("ctr", "apt-get install containerd (ctr imports the image archives)")
    if not Path(containerd_address).is_socket():
        raise HarnessError(f"no containerd socket at {containerd_address}: start containerd or pass its address")
    _ctr(containerd_address, namespace, "images", "import", "--base-name", built.repository, "--digests",
         "--snapshotter", snapshotter, str(built.tar))
    records = image_records(containerd_address, namespace)
    for name in (built.ref, built.digest_ref):
        if name not in records:
            raise HarnessError(f"containerd has no image {name} after importing {built.tar} "
                               f"(it has: {', '.join(sorted(records)) or 'none'})")
        if records[name] != built.manifest_digest:
            raise HarnessError(f"containerd's {name} points at {records[name]}, not the predicted "
                               f"{built.manifest_digest}: its importer changed; bump RECIPE after checking")
    try:
        _ctr(containerd_address, namespace, "snapshots", "--snapshotter", snapshotter, "info", built.chain_id)
    except HarnessError:
        raise HarnessError(f"{built.ref} was imported but not unpacked for {snapshotter} "
                           f"(no snapshot {built.chain_id[:19]}): check containerd's snapshotter") from None
    return built.ref, built.digest_ref


def main(argv: list[str] | None = None) -> int:
    """``python -m clusterproof.provision.images [pause] [checker] [--import SOCKET]``: build (default: both), print
    name, tag, digest ref, size; ``--import``: import them into that containerd's k8s.io namespace."""
    args = list(sys.argv[1:] if argv is None else argv)
    address = None
    if "--import" in args:
        i = args.index("--import")
        if i + 1 >= len(args):
            print("clusterproof: --import needs a containerd socket path", file=sys.stderr)
            return exitcodes.USAGE
        address = args[i + 1]
        del args[i:i + 2]
    by_name = {im.name: im for im in IMAGES}
    unknown = [a for a in args if a not in by_name]
    if unknown:
        print(f"clusterproof: unknown argument {unknown[0]!r} (usage: python -m clusterproof.provision.images "
              f"[pause] [checker] [--import SOCKET])", file=sys.stderr)
        return exitcodes.USAGE
    try:
        for im in [by_name[a] for a in args] or list(IMAGES):
            t0 = time.monotonic()
            progress_lines.to_terminal()   # the builds' heartbeats, timestamped, on stderr
            b = build(im, progress=lambda m: print(m, flush=True))
            took = time.monotonic() - t0
            print(f"{b.name:8} {b.ref}  {b.digest_ref}  {b.size / 1e6:.1f} MB  "
                  f"{'cached' if b.cached else f'built in {took:.1f} s'}", flush=True)
            if address:
                import_into(b, address)
                print(f"{'':8} imported into {address} (k8s.io): {b.ref}, {b.digest_ref}", flush=True)
    except HarnessError as e:   # a build or an import failed: a set-up failure
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.SETUP_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
