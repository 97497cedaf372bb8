"""Kubernetes API clients from a kubeconfig, with user mistakes turned into one line.

Why a module: a wrong path, an unknown context and an unreachable server are
the three commonest ways a pre-upgrade run goes wrong; each must say what is
wrong and how to fix it, and never print credentials (only the server URL).
"""
from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from clusterproof.core import redact
from clusterproof.core.errors import HarnessError


def load_client(kubeconfig: str | Path, context: str | None = None,
                pool_size: int = 16) -> client.ApiClient:
    path = Path(os.path.expanduser(str(kubeconfig)))
    if not path.exists():
        raise HarnessError(f"kubeconfig {path} does not exist: pass --cp-kubeconfig with the path "
                           "to your cluster's kubeconfig")
    if not os.access(path, os.R_OK) or path.is_dir():
        raise HarnessError(f"kubeconfig {path} is not a readable file: check its permissions")
    try:
        contexts, _current = config.list_kube_config_contexts(config_file=str(path))
    except (ConfigException, Exception) as e:  # malformed YAML surfaces as various errors
        raise HarnessError(f"kubeconfig {path} cannot be parsed ({type(e).__name__}): "
                           "check it with `kubectl config view`") from None
    names = [c["name"] for c in contexts or []]
    if context is not None and context not in names:
        raise HarnessError(f"context {context!r} is not in {path}; available: "
                           f"{', '.join(names) or 'none'} (see `kubectl config get-contexts`)")
    check_data_fields(path, context)
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=str(path), context=context,
                                client_configuration=cfg, persist_config=False)
    except ConfigException as e:
        raise HarnessError(f"kubeconfig {path}: {str(e).splitlines()[0]}") from None
    except (ValueError, TypeError) as e:   # binascii.Error is a ValueError; a field of the wrong type
        why = "a *-data field is not valid base64" if isinstance(e, binascii.Error) else type(e).__name__
        raise HarnessError(f"kubeconfig {path} cannot be loaded ({why}): check it with `kubectl config view`") from None
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


# The kubeconfig fields that hold a file's contents as base64 (kind of entry -> fields).
DATA_FIELDS = {"cluster": ("certificate-authority-data",), "user": ("client-certificate-data", "client-key-data")}


def check_data_fields(path: Path, context: str | None) -> None:
    """Every ``*-data`` field of the context's cluster and user is base64, or one line naming it.

    Why here: the kubernetes client decodes them while loading and lets binascii's error out
    as a traceback. The value itself is never shown (it may be a private key).
    """
    try:
        doc = yaml.safe_load(path.read_bytes())
    except (OSError, yaml.YAMLError):
        return   # the client's own loading says what is wrong with the file
    if not isinstance(doc, dict):
        return
    name = context or doc.get("current-context")
    ctx = next((c.get("context") or {} for c in doc.get("contexts") or []
                if isinstance(c, dict) and c.get("name") == name), {})
    for kind, fields in DATA_FIELDS.items():
        ref = ctx.get(kind) if isinstance(ctx, dict) else None
        entry = next((e.get(kind) or {} for e in doc.get(f"{kind}s") or []
                      if isinstance(e, dict) and e.get("name") == ref), {})
        for f in fields:
            value = entry.get(f) if isinstance(entry, dict) else None
            if value is None:
                continue
            try:
                base64.standard_b64decode(value)
            except (binascii.Error, ValueError, TypeError) as e:
                why = "not text" if isinstance(e, TypeError) else str(e).split(":")[0].lower()
                raise HarnessError(f"kubeconfig {path}: {f} of {kind} {ref!r} is not valid base64 ({why}): "
                                   f"put the base64 of the PEM file there (base64 -w0 FILE), or name the file "
                                   f"with {f.removesuffix('-data')}") from None


def server_url(api: client.ApiClient) -> str:
    """The API server's URL as the harness shows it: never with a ``user:pass@`` (clusterproof.core.redact)."""
    return redact.url(api.configuration.host)


def check_reachable(api: client.ApiClient, timeout: float = 10.0) -> dict:
    """GET /version; return it, or raise one readable line naming the server."""
    try:
        v = client.VersionApi(api).get_code(_request_timeout=timeout)
    except urllib3.exceptions.MaxRetryError as e:
        reason = getattr(e, "reason", e)
        raise HarnessError(f"cannot reach the API server at {server_url(api)} ({short_reason(reason)}): "
                           "check that the cluster is up and the kubeconfig/context points to it") from None
    except client.ApiException as e:
        hint = ("the kubeconfig's credentials were refused; refresh them"
                if e.status in (401, 403) else "check the API server's health")
        raise HarnessError(f"API server at {server_url(api)} answered {e.status} {e.reason} "
                           f"to GET /version: {hint}") from None
    except Exception as e:  # SSL errors, timeouts, bad URLs
        raise HarnessError(f"cannot talk to the API server at {server_url(api)} ({short_reason(e)}): "
                           "check the kubeconfig's server address and certificates") from None
    return {"gitVersion": v.git_version, "platform": v.platform}


def short_reason(e: object) -> str:
    """An exception's text without urllib3's wrapping: what a one-line error quotes."""
    text = str(e)
    for marker in ("Failed to establish a new connection: ", "] "):
        if marker in text:
            text = text.split(marker, 1)[1]
    return text.strip("'\" )(")[:160]


# --- requests that survive a dropped connection ---------------------------------------------------
#
# How long a request keeps retrying connection errors, and how: doubling from 0.25 s to 4 s with
# jitter. 60 s covers an apiserver restarted by the supervisor (2 s to notice, seconds for kwokctl to
# start it, seconds to serve) or a load balancer moving to another replica; a longer outage is a
# control plane that is down, and the caller (the module guard, an informer) says so.
RETRY_S = 60.0
RETRY_FIRST_S, RETRY_MAX_S = 0.25, 4.0
READS = frozenset({"GET", "HEAD", "OPTIONS"})
NOT_SENT, MAYBE_SENT = "not sent", "may have reached the server"
# Set on an ApiException whose request was sent again after an attempt that may have reached the
# server: a 409 to a create or a 404 to a delete may then be the first attempt's own doing.
RESENT = "clusterproof_resent"


def connection_error(e: BaseException) -> str | None:
    """Is ``e`` a connection error, and could the request have reached the server?

    ``NOT_SENT``: the connection was never made (refused, connect timeout,
    name resolution): nothing was sent, any request may be sent again.
    ``MAYBE_SENT``: the connection broke after it was made (reset, aborted,
    closed mid-response, TLS torn down): the server may have received and
    applied the request. ``None``: not a connection error -- an HTTP answer
    (raised as ApiException) or a read timeout (a slow server, not a lost
    connection: sending the request again would only double the wait).
    """
    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        e = e.reason
    if isinstance(e, (urllib3.exceptions.ConnectTimeoutError, ConnectionRefusedError)):
        return NOT_SENT       # NewConnectionError (refused, unreachable, DNS) is a ConnectTimeoutError
    if isinstance(e, urllib3.exceptions.ReadTimeoutError):
        return None
    if isinstance(e, (urllib3.exceptions.ProtocolError, urllib3.exceptions.SSLError, ConnectionError,
                      http.client.HTTPException)):
        return MAYBE_SENT
    if isinstance(e, client.ApiException) and e.status == 0 and "SSLError" in str(e.reason):
        return MAYBE_SENT     # the client library turns a bare urllib3 SSLError into status 0
    return None


def _retrying(method: str, path: str, attempt, retry_s: float, resend: bool):
    """``attempt()`` until it succeeds, a failure is not worth retrying, or ``retry_s`` has passed."""
    t0, n, sent = time.monotonic(), 0, False
    while True:
        n += 1
        try:
            return attempt()
        except client.ApiException as e:
            if sent:
                setattr(e, RESENT, True)
            if e.status != 504 and connection_error(e) is None:
                raise
            kind, err = MAYBE_SENT, e
        except Exception as e:
            kind, err = connection_error(e), e
            if kind is None:
                raise
        left = t0 + retry_s - time.monotonic()
        if n == 1 and retry_s > 0 and getattr(err, "status", None) == 504:
            left = max(left, RETRY_FIRST_S)   # the server's own deadline spent the budget: one more try
        safe = kind == NOT_SENT or method in READS or resend
        if not safe or left <= 0:
            why = (f"not sent again: a {method} that {MAYBE_SENT} is not safe to repeat" if not safe
                   else f"gave up after {retry_s:g} s")
            what = "answered 504, the server's own deadline" if getattr(err, "status", None) == 504 else \
                "connection failed"
            err.add_note(f"clusterproof: {method} {path}: {what} ({n} attempt(s) in "
                         f"{time.monotonic() - t0:.1f} s; {why})")
            raise err
        sent = sent or kind == MAYBE_SENT
        # A bounded backoff inside the retry loop (not synchronisation), with jitter so that many
        # threads cut off at once do not come back in step.
        time.sleep(min(left, min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (n - 1)) * random.uniform(0.5, 1.0)))


def _send(api: client.ApiClient, method: str, path: str, query, headers, body, timeout):
    headers = headers or {"Accept": "application/json"}
    if body is not None:
        headers = {"Content-Type": "application/json", **headers}
    params = api.param_serialize(method, path, query_params=list((query or {}).items()),
                                 header_params=headers,
                                 body=body, auth_settings=["BearerToken"])
    resp = api.call_api(*params, _request_timeout=timeout)
    if not 200 <= resp.status <= 299:
        resp.read()
        raise client.ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response


def _budget(query: dict | None, retry_s: float | None) -> float:
    if retry_s is not None:
        return retry_s
    # A streaming watch is resumed by its informer (from its last resourceVersion), never here.
    return 0.0 if str((query or {}).get("watch", "")).lower() in ("true", "1") else RETRY_S


def raw_request(api: client.ApiClient, method: str, path: str, query: dict | None = None,
                headers: dict | None = None, body=None, timeout=60, *, retry_s: float | None = None,
                resend: bool = False):
    """One API request, undecoded: returns the streaming urllib3 response.

    Why raw: decoding into model objects costs ~1 ms per Node; raw JSON is
    what large lists, watches and /metrics need. Non-2xx raises ApiException
    like the typed calls do.

    Connection errors are retried for up to ``retry_s`` (``RETRY_S``; 0 for a
    watch, which its informer resumes) with jittered exponential backoff --
    but only where sending the request again is safe:

    - a request that was never sent (connection refused, connect timeout):
      any method, nothing reached the server;
    - a read (GET, HEAD, OPTIONS) whose connection broke after it was sent:
      reading twice changes nothing;
    - a write (POST, PUT, PATCH, DELETE) whose connection broke after it was
      sent: only if the caller passes ``resend=True``, saying that it
      handles the write having been applied already. The server may have
      applied it: a create sent again then gets 409, a delete 404, a
      conditional patch 409. ``create_if_absent`` and ``delete_if_present``
      do (the exception then carries ``RESENT``); every other write fails
      at once with its connection error, because repeating it blindly could
      apply it twice or report a conflict the harness itself caused.

    A 504 is the one HTTP answer treated like a connection that broke after
    it was sent: kube-apiserver's own deadline passed (``metav1``
    StatusReasonTimeout, "the request might succeed" again) and the write may
    or may not have been applied. It is sent again once, under the same
    rules, even if its wait used up ``retry_s`` (a pod create can wait 60 s
    for its 504 on a machine running several clusters).
    The API health guard still counts the 504 against the module. Other
    HTTP answers (429, other 5xx) are not retried here: they are the
    cluster's answer, and the guard and the checks judge them. A read
    timeout is not retried either (a slow server; a retry would double the
    wait). Each attempt is a request of its own to the client library.
    """
    return _retrying(method, path, lambda: _send(api, method, path, query, headers, body, timeout),
                     _budget(query, retry_s), resend)


def request_data(api: client.ApiClient, method: str, path: str, query: dict | None = None,
                 headers: dict | None = None, body=None, timeout=60, *, retry_s: float | None = None,
                 resend: bool = False) -> bytes:
    """``raw_request`` and its whole body read, retried together: a connection that breaks while the
    body arrives is a connection error too (an IncompleteRead), with the same rules."""
    return _retrying(method, path, lambda: _send(api, method, path, query, headers, body, timeout).data,
                     _budget(query, retry_s), resend)


def _ours(api: client.ApiClient, path: str, body: dict) -> dict | None:
    """The existing object named in ``body``, if it carries every label and annotation ``body`` gave it.

    After a create was sent again (its first attempt may have been applied),
    a 409 is our own first attempt if the object bears our marks: the run id
    label and the creation annotations (host, second) that ``run.metadata``
    puts on everything. A body without marks cannot be told apart: None.
    """
    meta = body.get("metadata") or {}
    marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    if not marks or not meta.get("name"):
        return None
    try:   # a LIST by name, not a GET: a guest may list what it creates in its pool, and needs no `get`
        items = json.loads(request_data(api, "GET", path, {"fieldSelector": f"metadata.name={meta['name']}"}))["items"]
    except client.ApiException:
        return None
    if not items:
        return None
    found = items[0]
    have = {**(found["metadata"].get("labels") or {}), **(found["metadata"].get("annotations") or {})}
    return found if all(have.get(k) == v for k, v in marks.items()) else None


def create_object(api: client.ApiClient, path: str, body: dict, query: dict | None = None) -> dict:
    """POST ``body`` to the collection ``path``; the object as admitted.

    Safe across a broken connection (``resend``): a 409 after a resend is
    our own first attempt if the object bears our marks (``_ours``), and
    that object is returned; any other 409 is raised, as without a resend.
    """
    try:
        return json.loads(request_data(api, "POST", path, query, body=body, resend=True))
    except client.ApiException as e:
        found = _ours(api, path, body) if e.status == 409 and getattr(e, RESENT, False) else None
        if found is None:
            raise
        return found


def delete_if_present(api: client.ApiClient, path: str, query: dict | None = None, body: dict | None = None) -> bool:
    """DELETE ``path``; False if it was already gone (404), any other error raised.

    The one 404-tolerant delete: every "remove what the run created" goes
    through it, so a second teardown (or a sweeper racing a normal end) is
    harmless. ``body``: DeleteOptions, e.g. ``{"preconditions": {"uid": ...}}``
    (409 Conflict if the object there now is another one of the same name).
    Sent again after a broken connection (``resend``): a 404 then most
    likely means the first attempt deleted it, and it counts as deleted here
    (True) -- callers count what they removed.
    """
    try:
        request_data(api, "DELETE", path, query, body=body, resend=True)
        return True
    except client.ApiException as e:
        if e.status != 404:
            raise
        return bool(getattr(e, RESENT, False))


def delete_each(api: client.ApiClient, paths: list[str], query: dict | None = None, workers: int = 16) -> int:
    """``delete_if_present`` on every path, ``workers`` at a time; how many were still there.

    Why not one collection DELETE: kube-apiserver deletes a collection inside
    one request (``--delete-collection-workers``, 1 by default) and answers 504
    once its 60 s request timeout passes -- measured at 7,500 nodes for 4,000
    pods -- and the client library then sends the same request again. One
    request per object stays short, and the API health guard sees no 5xx
    the harness caused itself. 16 workers: well inside the client's pool.
    """
    if not paths:
        return 0
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return sum(pool.map(lambda p: delete_if_present(api, p, query), paths))


def create_if_absent(api: client.ApiClient, path: str, body: dict) -> bool:
    """POST ``body`` to the collection ``path``; False if an object of that name exists already (409).

    The one 409-tolerant create: a second set-up (a re-run in the same
    namespace, a restart) finds what the first made and goes on. Sent again
    after a broken connection (``resend``): a 409 is then our own first
    attempt if the object carries every label and annotation of ``body``
    (``_ours``), and counts as created (True) -- callers that remove
    "what they created" must not leave it behind, nor take someone else's.
    """
    try:
        request_data(api, "POST", path, body=body, resend=True)
        return True
    except client.ApiException as e:
        if e.status != 409:
            raise
        return bool(getattr(e, RESENT, False)) and _ours(api, path, body) is not None


def list_raw(api: client.ApiClient, path: str, query: dict | None = None,
             timeout: float = 120, retry_s: float | None = None) -> dict:
    """GET a collection (or one object) as a plain dict (no model objects)."""
    return json.loads(request_data(api, "GET", path, query, timeout=timeout, retry_s=retry_s))


# A collection's objects as their metadata only (meta.k8s.io/v1 PartialObjectMetadataList, which
# kube-apiserver serves for every resource): what a wait for objects to go needs (names, deletion
# timestamps), without the specs and statuses a full LIST encodes, sends and the harness decodes.
METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"}


def list_metadata(api: client.ApiClient, path: str, query: dict | None = None, timeout: float = 120) -> list[dict]:
    """The ``metadata`` of every object of the collection at ``path`` (one LIST, ``METADATA_ONLY``)."""
    data = json.loads(request_data(api, "GET", path, query, headers=METADATA_ONLY, timeout=timeout))
    return [item["metadata"] for item in data.get("items") or []]


def get_if_present(api: client.ApiClient, path: str, query: dict | None = None) -> dict | None:
    """GET ``path`` as a dict; None on 404 (also for an API group the cluster does not serve)."""
    try:
        return list_raw(api, path, query)
    except client.ApiException as e:
        if e.status != 404:
            raise
        return None


def list_all(api: client.ApiClient, path: str, query: dict | None = None, page: int = 500,
             timeout: float = 120) -> Iterator[dict]:
    """Every item of a collection, fetched in pages of ``page`` (``limit``/``continue``).

    Why pages: a decision about "every node" must see every node, and a
    7,500-node LIST in one response is what a careful client avoids.
    """
    q = dict(query or {}, limit=str(page))
    while True:
        listing = list_raw(api, path, q, timeout=timeout)
        yield from listing.get("items", [])
        token = (listing.get("metadata") or {}).get("continue")
        if not token:
            return
        q["continue"] = token


MERGE_PATCH = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}


def merge_patch(api: client.ApiClient, path: str, body: dict) -> dict:
    """A JSON merge patch; put ``metadata.resourceVersion`` in ``body`` for a conditional write."""
    return json.loads(raw_request(api, "PATCH", path, headers=MERGE_PATCH, body=body).data)


def api_message(e: client.ApiException) -> str:
    """The Status message of an API error (what the apiserver or admission said)."""
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def is_kwok_node(node: dict) -> bool:
    return (node["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) == "fake"


def is_simulated(api: client.ApiClient) -> bool:
    """True if the cluster has nodes and every one of them is a kwok node.

    Why every node (paged), not a sample: a mixed cluster whose first nodes
    are kwok nodes is real hardware, and the destructive opt-in must not be
    bypassable by the order in which nodes are listed.
    """
    seen = False
    for node in list_all(api, "/api/v1/nodes"):
        seen = True
        if not is_kwok_node(node):
            return False
    return seen


def serving(api: client.ApiClient, candidates: tuple[str, ...], resource: str) -> str | None:
    """The first group/version of ``candidates`` (newest first) whose discovery lists ``resource``, or None:
    the API a check speaks is the one the server serves (a 1.35 cluster's Workload is v1alpha1, a 1.37's
    v1beta1), read from the server, never assumed from its version."""
    for gv in candidates:
        found = get_if_present(api, f"/apis/{gv}") or {}
        if any(r.get("name") == resource for r in found.get("resources", [])):
            return gv
    return None
