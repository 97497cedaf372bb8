"""Client identities of the embedded cluster's components, as a real cluster has them.

Why: kwokctl v0.8.0 gives every component one client certificate (CN
``kwok-admin``, O ``system:masters``), and API Priority and Fairness exempts
``system:masters``. On such a cluster the simulated kubelets' heartbeats,
kube-scheduler and kube-controller-manager are never queued or rejected, so
"system flows survive an overload" would be trivially true. Here each gets
its own certificate, signed by the cluster's CA:

- kube-scheduler: ``system:kube-scheduler`` (FlowSchema ``kube-scheduler`` ->
  ``workload-high``; its leader lease ``system-leader-election``);
- kube-controller-manager: ``system:kube-controller-manager`` with
  ``--use-service-account-credentials`` as kubeadm runs it: its own requests
  (informers, token requests) match ``kube-controller-manager`` ->
  ``workload-high``, each controller's match ``kube-system-service-accounts``
  -> ``workload-high``;
- the kwok controller (every simulated kubelet): ``kwok:simulated-kubelets``
  in group ``system:nodes``, so its lease renewals and node status writes
  match ``system-node-high`` -> ``node-high`` and the rest of its traffic
  ``system-nodes`` -> ``system``, exactly as real kubelets' do. The user name
  deliberately lacks the ``system:node:`` prefix: the Node authorizer would
  otherwise confine it to one node's objects. RBAC gives it what a kubelet
  may do (ClusterRole ``system:node``) plus list/watch on node leases,
  which kwok's lease controller needs (``grant_simulated_kubelets``).

The harness itself keeps kwokctl's admin certificate (node creation, set-up
and measurement stay exempt), and so do the Coscheduling extra components.

How, through kwokctl only: kwokctl generates the PKI only when the cluster's
``pki/`` directory does not exist yet (``runtime/binary/cluster_setup.go``,
kwok v0.8.0), so ``write_pki`` creates it first -- the CA and the admin
certificate exactly as kwokctl would (CN, O, SANs, both key usages), plus one
client certificate per component -- and ``components_patches`` points each
component at its own kubeconfig (``componentsPatches`` with ``override``,
the scheduler through its ``--config``). kwokctl records the patched command
lines, so ``kwokctl start cluster`` (the supervisor's restart) starts them
with the same identities. Certificates are made with the ``openssl`` CLI.
"""
from __future__ import annotations

import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.kube.client import create_if_absent

ADMIN_USER, ADMIN_GROUP = "kwok-admin", "system:masters"          # kwokctl's pki.DefaultUser/DefaultGroups
# kwokctl's pki.DefaultAltNames (the admin certificate is also the apiserver's serving certificate).
ADMIN_SANS = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
              "kueue-webhook-service.kueue-system.svc", "jobset-webhook-service.jobset-system.svc",
              "lws-webhook-service.lws-system.svc", "localhost", "127.0.0.1", "::1")
VALID_DAYS = 36500                                                 # kwokctl: 100 years
KUBELETS_USER = "kwok:simulated-kubelets"
NODES_GROUP = "system:nodes"
KUBELET_ROLE_BINDING = "clusterproof:simulated-kubelets"
LEASE_READER = "clusterproof:simulated-kubelets-lease-reader"


@dataclass(frozen=True)
class Identity:
    component: str              # kwokctl's component name
    user: str                   # certificate CN: the user name the apiserver sees
    groups: tuple[str, ...]     # certificate O: its groups
    flow_schemas: tuple[str, ...]   # where APF puts its traffic on a stock cluster (what describe() reports)

    @property
    def file(self) -> str:
        return self.component


IDENTITIES = (
    Identity("kube-scheduler", "system:kube-scheduler", (), ("kube-scheduler",)),
    Identity("kube-controller-manager", "system:kube-controller-manager", (),
             ("kube-controller-manager", "kube-system-service-accounts")),
    Identity("kwok-controller", KUBELETS_USER, (NODES_GROUP,), ("system-node-high", "system-nodes")),
)


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise HarnessError("openssl is not installed: the embedded cluster's component certificates are made "
                           "with it (apt-get install openssl), or set component_identities: false")
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise HarnessError(f"openssl {args[0]} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def _subject(user: str, groups: tuple[str, ...]) -> str:
    return "".join(f"/O={g}" for g in groups) + f"/CN={user}"


def host_ips() -> list[str]:
    """Every address of this machine (kwokctl adds them to the serving certificate, too)."""
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            try:
                out.append(str(ipaddress.ip_address(a.address.split("%")[0])))
            except ValueError:
                continue
    return out


def sans(names: tuple[str, ...]) -> str:
    """An openssl subjectAltName value: IPs as IP:, the rest as DNS:, each once."""
    seen, out = set(), []
    for n in names:
        if n in seen:
            continue
        seen.add(n)
        try:
            ipaddress.ip_address(n)
            out.append(f"IP:{n}")
        except ValueError:
            out.append(f"DNS:{n}")
    return ",".join(out)


def sign(pki: Path, name: str, user: str, groups: tuple[str, ...], ext: list[str], rsa: bool) -> None:
    """``<pki>/<name>.{crt,key}`` signed by the cluster's CA: subject ``user`` in ``groups``, X.509 extensions
    ``ext`` (a client identity here; a serving certificate for clusterproof.cluster.kueue)."""
    key = ["-newkey", "rsa:2048"] if rsa else ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    _openssl("req", "-new", *key, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", _subject(user, groups), cwd=pki)
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", str(VALID_DAYS), "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=pki)
    for tmp in (f"{name}.csr", f"{name}.ext"):
        (pki / tmp).unlink()
    (pki / f"{name}.key").chmod(0o600)


def sign_client(pki: Path, name: str, user: str, groups: tuple[str, ...]) -> None:
    """A client certificate ``<name>.crt`` for ``user`` in ``groups``, signed by the cluster's CA."""
    sign(pki, name, user, groups, ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
                                    "extendedKeyUsage=clientAuth"], rsa=False)


def write_pki(pki: Path) -> None:
    """The cluster's PKI before kwokctl runs: CA, admin (kwokctl's own recipe), one cert per component."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-subj", "/CN=kwok-ca", "-days", str(VALID_DAYS), "-sha256",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign", cwd=pki)
    (pki / "ca.key").chmod(0o600)
    sign(pki, "admin", ADMIN_USER, (ADMIN_GROUP,),
          ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
           "extendedKeyUsage=serverAuth,clientAuth", f"subjectAltName={sans(ADMIN_SANS + tuple(host_ips()))}"],
          rsa=True)
    for ident in IDENTITIES:
        sign_client(pki, ident.file, ident.user, ident.groups)


def write_kubeconfig(path: Path, server: str, pki: Path, name: str) -> Path:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": name,
           "clusters": [{"name": name, "cluster": {"server": server,
                                                   "certificate-authority": str(pki / "ca.crt")}}],
           "users": [{"name": name, "user": {"client-certificate": str(pki / f"{name}.crt"),
                                             "client-key": str(pki / f"{name}.key")}}],
           "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
    path.write_text(yaml.safe_dump(cfg))
    return path


def components_patches(directory: Path, server: str, scheduler_config: Path) -> list[dict]:
    """kwokctl ``componentsPatches``: each component's --kubeconfig (the scheduler's --config) replaced
    by its own; kube-controller-manager runs each controller as its ServiceAccount (as kubeadm does)."""
    pki = directory / "pki"
    kube = {i.component: write_kubeconfig(directory / f"{i.file}.kubeconfig", server, pki, i.file)
            for i in IDENTITIES}
    doc = yaml.safe_load(scheduler_config.read_text())
    doc.setdefault("clientConnection", {})["kubeconfig"] = str(kube["kube-scheduler"])
    scheduler_config.write_text(yaml.safe_dump(doc))

    def arg(key, value, override=True):
        return {"key": key, "value": value, "override": override}
    return [
        {"name": "kube-scheduler", "extraArgs": [arg("config", str(scheduler_config))]},
        {"name": "kube-controller-manager", "extraArgs": [
            arg("kubeconfig", str(kube["kube-controller-manager"])),
            arg("use-service-account-credentials", "true", override=False)]},
        {"name": "kwok-controller", "extraArgs": [arg("kubeconfig", str(kube["kwok-controller"]))]},
    ]


def kubelet_rbac() -> list[tuple[str, dict]]:
    """(collection path, object): what the simulated kubelets' identity is granted.

    Part of the cluster, not of a run: no run label, so no sweeper (e.g. of a
    later run against a kept cluster) ever takes the kubelets' rights away.
    """
    def metadata(name: str) -> dict:
        return {"name": name, "labels": {"app.kubernetes.io/managed-by": "clusterproof"}}
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    subject = [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": KUBELETS_USER}]
    return [
        (f"{rbac}/clusterroles", {"metadata": metadata(LEASE_READER), "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]}]}),
        (f"{rbac}/clusterrolebindings", {"metadata": metadata(KUBELET_ROLE_BINDING), "subjects": subject,
                                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                     "name": "system:node"}}),
        (f"{rbac}/clusterrolebindings", {"metadata": metadata(LEASE_READER), "subjects": subject,
                                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                     "name": LEASE_READER}}),
    ]


def grant_simulated_kubelets(api: client.ApiClient) -> None:
    """Create the simulated kubelets' RBAC right after the control plane is up (kwok's informers retry
    the few forbidden lists before it, as a kubelet does while RBAC bootstraps)."""
    for path, body in kubelet_rbac():
        create_if_absent(api, path, body)
