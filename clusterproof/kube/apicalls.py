"""Every API request the harness's identity makes, in RBAC's own terms.

Why: least privilege is proven by a run, not by a reading. The recorder sits
on the one request path of every Kubernetes client the harness builds
(``ApiClient.rest_client.request``; the aiohttp watch streams report to it
too) and keeps, per request, what an RBAC rule is matched against: verb,
API group, resource, subresource, namespace and name -- the attributes
kube-apiserver's own request-info parser derives from the URL
(``k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``), restated here
in a few lines. A self-test compares what a run used with what
``clusterproof/kube/rbac.yaml`` grants, both ways; the report attaches the list, so an
SRE can show a security reviewer what a run against their cluster did.

It also hands every create to ``before_create`` listeners (before it is
sent) and every successful one to ``on_create`` listeners: the run's owner
record (``clusterproof.kube.ownership``) learns of everything the run creates outside
its own namespaces from here, so no create site can forget to record it.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from clusterproof.kube.manifests import policy_names

# Subresources of a namespace itself (``/api/v1/namespaces/x/status``), as in request-info.
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True, order=True)
class Call:
    """One request as RBAC authorizes it. ``path`` is set (and the rest empty) for a non-resource URL."""
    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def is_resource(self) -> bool:
        return not self.path

    def describe(self) -> str:
        """'list pods in namespace x', 'patch nodes/n1', 'get /metrics', 'create flowschemas (flowcontrol...)'."""
        if not self.is_resource:
            return f"{self.verb} {self.path}"
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        what += f" {self.name}" if self.name else ""
        what += f" ({self.group})" if self.group else ""
        return f"{self.verb} {what} " + (f"in namespace {self.namespace}" if self.namespace else "(cluster scope)")


def resource_of(resource: str, subresource: str = "", group: str = "") -> str:
    """'pods', 'pods/eviction', 'leases.coordination.k8s.io', '(non-resource) /readyz' (pure; kube-apiserver
    counts a non-resource request with its path as the subresource)."""
    if not resource:
        return f"(non-resource) {subresource}" if subresource else "(non-resource)"
    name = f"{resource}.{group}" if group else resource
    return f"{name}/{subresource}" if subresource else name


def classify(method: str, url: str) -> Call:
    """The RBAC attributes of one request (method + URL with or without scheme and host)."""
    split = urlsplit(url)
    parts = [p for p in split.path.split("/") if p]
    query = parse_qs(split.query)
    http_verb = method.upper()
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        rest = []
    if not rest:   # /version, /metrics, /readyz, discovery (/api, /apis/g/v) ...
        return Call(http_verb.lower(), path=split.path or "/")
    watch = False
    if rest[0] == "watch":        # the deprecated /watch/ prefix
        watch, rest = True, rest[1:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if resource == "namespaces" and namespace and name == namespace:
        namespace = ""            # a namespace object is cluster-scoped
    if http_verb in ("GET", "HEAD"):
        watch = watch or query.get("watch", ["false"])[0] in ("true", "1")
        verb = "watch" if watch else ("get" if name else "list")
    elif http_verb == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _VERBS.get(http_verb, http_verb.lower())
    return Call(verb, group, resource, subresource, namespace, name)


CreateListener = Callable[[Call, dict], None]


class CallRecorder:
    """What one identity asked of the API server, with how each answer began (status code).

    ``install`` wraps one ApiClient; it can wrap several (the same identity
    through clients of different pool sizes). Thread-safe: informers and
    request pools call it from many threads.
    """

    def __init__(self):
        self.calls: Counter[tuple[Call, int]] = Counter()
        self._lock = threading.Lock()
        self._on_create: list[CreateListener] = []
        self._before_create: list[Callable[[Call, str, dict], None]] = []

    def install(self, api: client.ApiClient) -> "CallRecorder":
        rest = api.rest_client
        if getattr(rest, "_clusterproof_recorder", None) is self:
            return self
        original = rest.request

        def request(method, url, *args, **kwargs):
            body = kwargs.get("body")
            if method == "POST" and self._before_create and isinstance(body, dict):
                call = classify(method, url)
                if call.verb == "create":
                    for listener in list(self._before_create):
                        listener(call, urlsplit(url).path, body)
            try:
                resp = original(method, url, *args, **kwargs)
            except client.ApiException as e:
                self.record(method, url, e.status or 0)
                raise
            self.record(method, url, refusal_kind(resp, url), resp)
            return resp
        rest.request = request
        rest._clusterproof_recorder = self
        return self

    def on_create(self, listener: CreateListener) -> None:
        """``listener(call, object)`` after every successful create, with the object as admitted."""
        self._on_create.append(listener)

    def before_create(self, listener: Callable[[Call, str, dict], None]) -> None:
        """``listener(call, collection path, body)`` before every create leaves; it may add to the body."""
        self._before_create.append(listener)

    def record(self, method: str, url: str, status: int | str, resp=None) -> Call:
        call = classify(method, url)
        with self._lock:
            self.calls[(call, status)] += 1
        if resp is not None and call.verb == "create" and status in range(200, 300) and self._on_create:
            obj = _body(resp)
            if obj and (obj.get("metadata") or {}).get("uid"):
                for listener in list(self._on_create):
                    listener(call, obj)
        return call

    # --- what the run used ---------------------------------------------------------------

    def used(self) -> set[Call]:
        with self._lock:
            return {c for c, _ in self.calls}

    def by_verb_and_resource(self) -> Counter:
        """Requests so far by (verb, resource[/subresource]), every status together."""
        with self._lock:
            out: Counter = Counter()
            for (c, _status), n in self.calls.items():
                out[(c.verb, resource_of(c.resource, c.subresource, c.group))] += n
            return out

    def refused(self) -> dict[Call, int]:
        """Calls RBAC refused (403 Forbidden by the authorizer, not by admission), with how often."""
        with self._lock:
            out: Counter[Call] = Counter()
            for (c, status), n in self.calls.items():
                if status == FORBIDDEN_RBAC:
                    out[c] += n
            return dict(out)

    def dump(self) -> list[dict]:
        """Every distinct call with its status codes and counts (JSON for tests and the report)."""
        with self._lock:
            rows: dict[Call, Counter] = {}
            for (c, status), n in self.calls.items():
                rows.setdefault(c, Counter())[str(status)] += n
        return [{**asdict(c), "status": dict(s)} for c, s in sorted(rows.items())]


# A 403 is one of four things, and only the first is about permissions: the authorizer said no
# (RBAC: 'User "x" cannot <verb> resource ...'); one of the harness's own admission policies refused it
# (clusterproof/kube/rbac.yaml: the harness sent a shape it never makes -- a defect, unless it was the
# permission check's dry-run probe of that policy); another admission policy or webhook denied the object (the
# taint suite provokes the cluster's own on purpose); or something else (a namespace being terminated). A
# policy's refusal may also be a 422 (a validation without a reason).
FORBIDDEN_RBAC, FORBIDDEN_ADMISSION, FORBIDDEN_OTHER = "403 rbac", "403 admission", "403 other"
REFUSED_OWN_POLICY = "own policy"
DRY_RUN = " (dry run)"


def own_policy_refused(message: str) -> bool:
    """Does ``message`` name a policy of the manifests by its exact name (the cluster's own may share the prefix)?"""
    return any(f"ValidatingAdmissionPolicy '{name}'" in message for name in policy_names(destructive=True))


def refusal_kind(resp, url: str = "") -> int | str:
    """How ``resp`` ended, as the record keeps it: its status, or for a 403 which kind (FORBIDDEN_*), and for a
    refusal by one of the harness's own policies REFUSED_OWN_POLICY, with DRY_RUN for a server-side dry run."""
    if resp.status not in (403, 422):
        return resp.status
    message = str((_body(resp) or {}).get("message", ""))
    if own_policy_refused(message):
        return REFUSED_OWN_POLICY + (DRY_RUN if "dryRun=" in urlsplit(url).query else "")
    return _kind_of(message) if resp.status == 403 else resp.status


def _kind_of(message: str) -> str:
    if " cannot " in message and ("User " in message or "user " in message):
        return FORBIDDEN_RBAC
    if "denied" in message or "admission" in message.lower():
        return FORBIDDEN_ADMISSION
    return FORBIDDEN_OTHER


def refused_by_own_policy(e: client.ApiException) -> str:
    """The message, if one of the harness's own admission policies (clusterproof/kube/rbac.yaml) refused this
    request; "" otherwise. A check that expects the cluster to refuse something must not count this refusal as
    the cluster's verdict: the harness sent a shape its own allowlist does not admit."""
    if e.status not in (403, 422):
        return ""
    try:
        message = str(json.loads(e.body).get("message", ""))
    except (TypeError, ValueError, AttributeError):
        return ""
    return message if own_policy_refused(message) else ""


def refused_by_rbac(e: client.ApiException) -> bool:
    """Did the authorizer refuse this request (not an admission policy)? A check that expects a refusal
    must not count one of these as its verdict: the harness was not allowed to ask."""
    if e.status != 403:
        return False
    try:
        return _kind_of(str(json.loads(e.body).get("message", ""))) == FORBIDDEN_RBAC
    except (TypeError, ValueError, AttributeError):
        return False


def recorder_of(api: client.ApiClient) -> CallRecorder | None:
    """The recorder installed on ``api`` (for request paths that do not go through its rest client)."""
    return getattr(api.rest_client, "_clusterproof_recorder", None)


def load_dump(rows: list[dict]) -> dict[Call, dict[str, int]]:
    return {Call(**{k: v for k, v in r.items() if k != "status"}): r["status"] for r in rows}


def _body(resp) -> dict | None:
    """The JSON body of a create's answer (urllib3 caches it: the caller's ``.data`` still reads it)."""
    raw = getattr(resp, "response", resp)
    try:
        data = raw.data
        return json.loads(data) if data else None
    except (ValueError, AttributeError, TypeError):
        return None
