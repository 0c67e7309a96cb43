#!/usr/bin/env python3
"""An agent that asks Assent for approval before it deletes a file.

    python3 agent.py /tmp/reports/q3.csv

It asks the broker's HTTP API whether it may run the tool call
delete_file {"path": ...}, waits for the decision, checks that the decision
belongs to its request, and deletes a file only when the outcome is
"approved", and then the file named by the decision's args: an approver may
have edited them. Given the broker's decision key (--trust-decision-key), it
acts only on a decision that key signed. Ctrl-C cancels the request.
Standard library only.

Exit status: 0 approved and done, 1 error (nothing ran), 2 bad usage,
3 denied, 4 expired, 5 cancelled.
"""

import argparse
import base64
import hashlib
import http.client
import json
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request

from ed25519_verify import account_key, verify

EXIT_APPROVED, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
EXIT_FOR = {"denied": 3, "expired": 4, "cancelled": 5}
TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")  # agent names and request ids are subject tokens


def main(argv=None):
    # 1. Where the broker is and what to ask, from flags or the environment.
    p = argparse.ArgumentParser(description="Delete FILE once Assent approves it.")
    p.add_argument("file", help="the file to delete")
    p.add_argument("--url", default=os.environ.get("ASSENT_URL", "http://127.0.0.1:8080"),
                   help="the broker's HTTP API (env ASSENT_URL)")
    p.add_argument("--agent", default=os.environ.get("ASSENT_AGENT", "file-manager"),
                   help="the agent's name (env ASSENT_AGENT)")
    p.add_argument("--user", default=os.environ.get("ASSENT_USER", ""),
                   help="on whose behalf the agent acts (env ASSENT_USER)")
    p.add_argument("--id", help="request id; reuse one to retry the same request (default: new)")
    p.add_argument("--timeout", type=int, default=120, help="seconds to wait for a decision")
    p.add_argument("--retry-for", type=float, default=60,
                   help="seconds to keep retrying while the broker cannot be reached")
    p.add_argument("--trust-decision-key", action="append", default=[], metavar="A...",
                   help="accept only decisions this broker key signed; repeat it, or separate "
                        "keys with commas (env ASSENT_TRUST_DECISION_KEY)")
    a = p.parse_args(argv)
    request_id = a.id or uuid7()
    if not TOKEN.fullmatch(a.agent) or not TOKEN.fullmatch(request_id) or a.timeout <= 0:
        p.error("--agent and --id must be 1-128 of A-Z a-z 0-9 _ -, --timeout positive")
    listed = a.trust_decision_key + [os.environ.get("ASSENT_TRUST_DECISION_KEY", "")]
    trusted = {k.strip() for keys in listed for k in keys.split(",") if k.strip()}
    for key in sorted(trusted):
        try:
            account_key(key)
        except ValueError as e:
            p.error(f"--trust-decision-key {key}: not an nkeys account public key (A...): {e}")

    # 2. The request: the requested data, plus our id. Its digest is what
    # the broker's decision must name (docs/protocol.md, "The request digest").
    path = os.path.abspath(a.file)
    request = {"agent": a.agent, "tool": "delete_file", "args": {"path": path},
               "hint": f"Delete {path}?", "timeout": f"{a.timeout}s"}
    if a.user:
        request["user"] = a.user
    digest = request_digest(request)
    broker = Broker(a.url, os.environ.get("ASSENT_TOKEN", ""), a.retry_for)
    print(f"asking {a.url} for approval of delete_file {json.dumps(request['args'])} "
          f"as request {request_id} (agent {a.agent})", flush=True)

    try:
        # 3. Create the request and long-poll for its decision in the same
        # call. After a network error the call is sent again with the same
        # id: the broker takes it as a retry of the same request.
        print("waiting for a decision (Ctrl-C cancels the request)", flush=True)
        status, approval = broker.call("POST", f"/v1/approvals?wait={WAIT}s",
                                       dict(request, id=request_id))
        if status != 201:
            return fail(f"the broker refused request {request_id}: {error_text(status, approval)}")
        # 4. Still pending: wait on GET /v1/approvals/{id}?wait= until decided.
        give_up = time.monotonic() + a.timeout + 60
        while approval["state"] == "pending":
            print(f"request {request_id} is still pending; asking again", flush=True)
            if time.monotonic() > give_up:
                return fail(f"no decision for request {request_id} in time")
            status, approval = broker.call("GET", f"/v1/approvals/{request_id}?wait={WAIT}s")
            if status != 200:
                return fail(f"reading request {request_id}: {error_text(status, approval)}")
        # 5. With trusted keys, the decision is the first decided event
        # stored for the request that one of them signed: the approval holds
        # the decision's data, not its signature.
        decision = approval["decision"]
        if trusted:
            decision = signed_decision(broker, request_id, trusted, give_up)
            if decision is None:
                return fail(f"no decision for request {request_id} that a trusted key signed "
                            "in time; nothing was deleted")
    except KeyboardInterrupt:
        return cancel(broker, request_id)
    except BrokerUnreachable as e:
        return fail(f"{e}; rerun with --id {request_id} to retry the same request")
    except BrokerError as e:
        return fail(str(e))
    except ValueError as e:  # a body that is not JSON, or not UTF-8
        return fail(f"unreadable answer from {a.url}: {e}")

    # 6. Check the decision, then act on it.
    return act(decision, request_id, digest)


def act(decision, request_id, digest):
    """Deletes the decided file if the decision approves this request."""
    try:
        check(decision, request_id, digest)
    except ValueError as e:
        return fail(f"refusing the decision of request {request_id}: {e}")
    outcome = decision["outcome"]
    who = ", ".join(d["principal"] for d in decision.get("decided_by") or [])
    by = f" by {who}" if who else ""
    if outcome != "approved":
        print(f"request {request_id} {outcome}{by}: {decision.get('reason') or 'no reason given'};"
              " nothing was deleted", file=sys.stderr)
        return EXIT_FOR.get(outcome, EXIT_ERROR)
    # Always the decided args, never the requested ones.
    args = decision.get("args") or {}
    if not isinstance(args.get("path"), str):
        return fail(f"the approved args have no path: {canonical(args)}")
    if decision.get("edited"):
        print(f"the approver edited the arguments to {canonical(args)}", flush=True)
    print(f"approved{by}: deleting {args['path']}", flush=True)
    try:
        os.remove(args["path"])
    except OSError as e:
        return fail(f"delete_file failed: {e}")
    print(f"deleted {args['path']}", flush=True)
    return EXIT_APPROVED


def check(decision, request_id, digest):
    """Raises ValueError unless the decision is about this very request: its
    request id, args matching args_digest, and this request's digest (an
    approval must name it; another digest means the id was used by a
    different request)."""
    if not isinstance(decision, dict) or decision.get("request_id") != request_id:
        raise ValueError(f"it is not a decision about request {request_id}: {decision!r:.200}")
    if args_digest(decision.get("args")) != decision.get("args_digest"):
        raise ValueError(f"its args do not match args_digest {decision.get('args_digest')}")
    theirs = decision.get("request_digest") or ""
    if theirs != digest and (theirs or decision.get("outcome") == "approved"):
        raise ValueError(f"it is for request digest {theirs}, this request is {digest}: "
                         "the id was used by a different request")


def cancel(broker, request_id):
    """Withdraws the request after Ctrl-C, then reports how it ended."""
    print(f"interrupted: cancelling request {request_id}", flush=True)
    try:
        status, body = broker.call("POST", f"/v1/approvals/{request_id}/cancel",
                                   {"reason": "the agent was interrupted (Ctrl-C)"})
        if status == 404:
            return fail(f"request {request_id} never reached the broker; nothing was deleted")
        if status not in (200, 409, 410):  # 409/410: it was decided or expired first
            return fail(f"cancel {request_id}: {error_text(status, body)}")
        status, approval = broker.call("GET", f"/v1/approvals/{request_id}")
    except (BrokerUnreachable, KeyboardInterrupt, ValueError) as e:
        return fail(f"could not cancel request {request_id}: {e}")
    if status != 200 or not approval.get("decision"):
        return fail(f"how request {request_id} ended is unknown ({error_text(status, approval)});"
                    " nothing was deleted")
    outcome = approval["decision"]["outcome"]
    reason = approval["decision"].get("reason") or "no reason given"
    print(f"request {request_id} {outcome}: {reason}; nothing was deleted", file=sys.stderr)
    return EXIT_FOR["cancelled"] if outcome == "cancelled" else EXIT_ERROR


# ---- Signed decisions (docs/protocol.md, "Signed decisions") ----

LOOK_EVERY = 2  # seconds between reads of the stored decisions while none is signed


def signed_decision(broker, request_id, trusted, give_up):
    """Returns the data of the first decided event stored for the request
    that a trusted key signed, read from the audit log (GET /v1/audit, which
    holds the events as stored, signatures and all), or None if there is none
    by give_up (time.monotonic()). It says once of each other one that it
    skipped it."""
    skipped, said = set(), False
    while True:
        after = 0
        while True:  # the pages of the request's decided events, in stream order
            status, page = broker.call(
                "GET", f"/v1/audit?request={request_id}&type=decided&after={after}")
            if status != 200:
                raise BrokerError(f"reading the decided events of request {request_id}: "
                                  f"{error_text(status, page)}")
            for stored in page.get("events") or []:
                event = stored.get("event")
                if isinstance(event, dict) and signed_by_trusted(event, trusted):
                    return event["data"]
                if stored.get("seq") not in skipped:
                    skipped.add(stored.get("seq"))
                    print(f"skipping a message on {stored.get('subject')} (stream sequence "
                          f"{stored.get('seq')}): no trusted key signed it", flush=True)
            after = page.get("next")
            if not after:
                break
        if time.monotonic() > give_up:
            return None
        if not said:
            print(f"request {request_id} is decided, but no trusted key signed its decision; "
                  "waiting for one that did", flush=True)
            said = True
        time.sleep(LOOK_EVERY)


def signed_by_trusted(event, trusted):
    """Whether a trusted key signed event, a decided event in structured mode:
    its assentsig is "v1.<public key>.<signature>", the key is one of trusted,
    and the Ed25519 signature covers the event's canonical text."""
    parts = event["assentsig"].split(".") if type(event.get("assentsig")) is str else []
    if len(parts) != 3 or parts[0] != "v1" or parts[1] not in trusted:
        return False
    text = canonical_decision(event)
    signature = unbase64url(parts[2])
    if text is None or signature is None or len(signature) != 64:
        return False
    return verify(account_key(parts[1]), text, signature)


def canonical_decision(event):
    """The text a decided event's signature covers: seven lines joined by a
    line feed, in UTF-8, or None if it has none (a value missing, not a
    string, or holding a line break)."""
    data = event.get("data")
    if not isinstance(data, dict):
        return None
    lines = ["assent-decision-v1", event.get("id"), data.get("request_id"), data.get("outcome"),
             data.get("args_digest") or "", data.get("request_digest") or "",
             data.get("decided_at")]
    # type() rather than isinstance(): a JSON number (Number) is no string here.
    if not all(type(line) is str and "\n" not in line and "\r" not in line for line in lines):
        return None
    try:
        return "\n".join(lines).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no text at all
        return None


def unbase64url(text):
    """The bytes of unpadded base64url text, or None if it is not written
    exactly so (bits after the last byte must be zero)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None
    return raw if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == text else None


# ---- HTTP ----

WAIT = 60  # seconds each long poll lasts (the broker caps it at 5 minutes)


class BrokerUnreachable(Exception):
    pass


class BrokerError(Exception):
    """An answer of the broker that is an error."""


class Broker:
    """The broker's HTTP API. A call that fails without an answer (the
    connection refused or dropped, a timeout, 502/503/504) is sent again,
    unchanged, until retry_for seconds have passed."""

    def __init__(self, url, token, retry_for):
        self.url, self.retry_for = url.rstrip("/"), retry_for
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method, path, body=None):
        """Returns (status, decoded JSON body)."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        give_up, delay = time.monotonic() + self.retry_for, 0.25
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=self.headers)
            try:
                with urllib.request.urlopen(req, timeout=WAIT + 30) as resp:
                    return resp.status, loads_exact(resp.read())
            except urllib.error.HTTPError as e:  # an answer, with an error status
                if e.code not in (502, 503, 504):
                    try:
                        return e.code, loads_exact(e.read())
                    except ValueError:
                        return e.code, None
                problem = f"HTTP {e.code}"
            except (OSError, http.client.HTTPException) as e:  # no answer at all
                problem = str(e) or type(e).__name__
            if time.monotonic() + delay > give_up:
                raise BrokerUnreachable(f"{method} {self.url}{path}: {problem}")
            print(f"{method} {path}: {problem}; retrying in {delay:g}s", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 5)


def error_text(status, body):
    err = body.get("error") if isinstance(body, dict) else None
    return f"HTTP {status} {err['code']}: {err['message']}" if err else f"HTTP {status}"


def fail(message):
    print(message, file=sys.stderr, flush=True)
    return EXIT_ERROR


# ---- Digests (docs/protocol.md, "The args digest", "The request digest") ----

class Number(str):
    """A JSON number exactly as written: 1.50 stays 1.50 in the digest."""


def _refuse(name):
    raise ValueError(f"{name} is not JSON")


def loads_exact(data):
    """json.loads for a body, keeping numbers as written (Number). Invalid
    UTF-8 raises UnicodeDecodeError; a lone surrogate escape parses, but has
    no canonical form (encoding it raises)."""
    return json.loads(data.decode("utf-8"), parse_int=Number, parse_float=Number,
                      parse_constant=_refuse)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
            "\f": "\\f", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _quote(s):
    # " and \ escaped, \n \r \t \b \f short, other controls \u00xx, U+2028 and
    # U+2029 escaped, everything else as itself (no HTML escaping).
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " else c)
                         for c in s) + '"'


def canonical(value):
    """The canonical form: keys sorted by their UTF-8 bytes at every depth,
    no white space, numbers as written."""
    if isinstance(value, Number):
        return str(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return json.dumps(value, allow_nan=False)  # as json.dumps sent it
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-8"))
        return "{" + ",".join(_quote(k) + ":" + canonical(value[k]) for k in keys) + "}"
    raise ValueError(f"{value!r} is not JSON")


def sha256(value):
    # encode() raises on a lone surrogate: no canonical form, no digest.
    return "sha256:" + hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def args_digest(args):
    if args is not None and not isinstance(args, dict):
        raise ValueError("the args are not an object")
    return sha256(args or {})


def request_digest(request):
    """agent, args, call_id, labels, response_schema, session, tool and user;
    each left out when empty but args. This agent sends no call_id, labels or
    schema."""
    form = {k: request[k] for k in ("agent", "session", "tool", "user") if request.get(k)}
    form["args"] = request.get("args") or {}
    return sha256(form)


def uuid7():
    """A request id: 48 bits of Unix milliseconds, version, variant and random
    bits (RFC 9562), so that ids sort by time."""
    b = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + secrets.token_bytes(10))
    b[6] = 0x70 | b[6] & 0x0F
    b[8] = 0x80 | b[8] & 0x3F
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


if __name__ == "__main__":
    sys.exit(main())
