"""A real node's GPUs, handed to containers the way the NVIDIA container toolkit hands them in.

On a GPU node, containerd runs ``nvidia-container-runtime`` instead of runc:
a wrapper that, for a container whose environment asks for GPUs
(``NVIDIA_VISIBLE_DEVICES``, set by the device plugin or the image), adds
the driver's ``libnvidia-ml.so.1`` (and devices) to the container's OCI
spec and then runs runc. This module is that wrapper for a real node of the
embedded cluster, with the project's mock NVML library as the driver
(there is no GPU here): containerd's runc ``BinaryName`` is a small script
per node that runs ``python3 -S <this file> <node state> -- <runc args>``.

For ``create`` of a container whose env has ``NVIDIA_VISIBLE_DEVICES``
(not ``void``/``none``/empty), it adds to ``<bundle>/config.json``:

- a read-only bind mount of the node's library at
  ``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`` (where the toolkit puts it);
- the node's fault file, read-only, and the mock library's two variables
  (which machine it is, where its faults are): the node's simulated GPUs
  and whatever the run injected into them.

A node started without a library (``library: null`` in its state, the
negative control "NVML missing") hands in nothing: the checker must then say
so and the node must not be released. Every other runc call is passed
through unchanged (``os.execv``). Standard library only: containerd's shim
runs it for every runc call, so it starts with ``python3 -S``.
"""
from __future__ import annotations

import json
import os
import sys

LIB_TARGET = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
FAULTS_TARGET = "/etc/clusterproof/nvml-faults.json"
ASKS = "NVIDIA_VISIBLE_DEVICES"


def wants_gpus(env: list[str]) -> bool:
    for kv in env:
        k, _, v = kv.partition("=")
        if k == ASKS:
            return v.strip().lower() not in ("", "void", "none")
    return False


def inject(spec: dict, state: dict) -> bool:
    """Add the node's NVML library and GPU state to an OCI spec that asks for GPUs; True if it did. Pure."""
    proc = spec.get("process") or {}
    if not wants_gpus(proc.get("env") or []):
        return False
    mounts = spec.setdefault("mounts", [])
    env = proc.setdefault("env", [])
    if state.get("library"):
        mounts.append({"destination": LIB_TARGET, "type": "bind", "source": state["library"],
                       "options": ["rbind", "ro", "nosuid", "nodev"]})
    if state.get("faults"):
        mounts.append({"destination": FAULTS_TARGET, "type": "bind", "source": state["faults"],
                       "options": ["rbind", "ro", "nosuid", "nodev"]})
        env.append(f"{state['faults_env']}={FAULTS_TARGET}")
    env.append(f"{state['machine_env']}={state['machine']}")
    return True


def bundle_of(args: list[str]) -> str | None:
    """The ``--bundle`` of a runc ``create`` (or ``run``) call; None for every other call."""
    if not any(a in ("create", "run") for a in args):
        return None
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--bundle="):
            return a.split("=", 1)[1]
    return os.getcwd()


def main(argv: list[str]) -> None:
    state_path, sep, runc_args = argv[0], argv[1], argv[2:]
    assert sep == "--", "usage: gpu_runtime.py STATE -- RUNC-ARGS"
    with open(state_path) as f:
        state = json.load(f)
    bundle = bundle_of(runc_args)
    if bundle is not None:
        path = os.path.join(bundle, "config.json")
        with open(path) as f:
            spec = json.load(f)
        if inject(spec, state):
            with open(path + ".tmp", "w") as f:
                json.dump(spec, f)
            os.replace(path + ".tmp", path)
    os.execv(state["runc"], [state["runc"], *runc_args])


def write_wrapper(directory, machine: str, library: str | None, faults: str, runc: str) -> str:
    """The node's runtime: a state file and the script containerd runs as its runc (returns its path)."""
    from pathlib import Path

    from clusterproof.provision.toolchain import FAULTS_ENV, MACHINE_ENV
    d = Path(directory)
    state = d / "gpu-runtime.json"
    state.write_text(json.dumps({"machine": machine, "library": library, "faults": faults, "runc": runc,
                                 "faults_env": FAULTS_ENV, "machine_env": MACHINE_ENV}))
    script = d / "nvidia-container-runtime"
    script.write_text(f"#!/bin/sh\nexec /usr/bin/python3 -S {Path(__file__).resolve()} {state} -- \"$@\"\n")
    script.chmod(0o755)
    return str(script)


if __name__ == "__main__":
    main(sys.argv[1:])
