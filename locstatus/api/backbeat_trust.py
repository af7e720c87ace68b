"""Who may change the state through the Backbeat-compatible routes without the bearer token
(docs/http.md, "Putting locstatus where Backbeat's API server was").

Why it is shaped so: Backbeat's API server does not authenticate anybody; CloudServer does
(SigV4, ``Authorization: AWS4-HMAC-SHA256 ...``), then forwards the request, signature and
all, and Backbeat only checks that the peer address is in its ``healthChecks.allowFrom``
networks. locstatus cannot verify a SigV4 signature (the secret keys live in Vault), so it
trusts the same thing Backbeat trusts: the TCP peer. A Backbeat-route mutation whose peer is in
one of the operator's ``--backbeat-trust`` networks needs no bearer token; from anywhere else
it needs the token as before, and the ``/v1`` mutations always do. The peer is the socket's
own address (the sidecar turns off uvicorn's ``X-Forwarded-For`` rewriting), so a client cannot
claim a trusted address in a header.

A browser in a trusted network is such a peer too, and a page whose DNS name was re-pointed at
the sidecar (DNS rebinding) is same-origin with it, so the Origin check lets its requests
through, a forged ``Authorization: AWS4-HMAC-SHA256`` header included: a tokenless mutation
that a browser sent (it carries ``Origin``, as every browser POST and DELETE does) is served
only for a ``Host`` that no re-pointed name can be: an address literal, ``localhost``, or a
name given with ``--allow-host`` (421 otherwise; a hostile review paused and resumed a site
from such a page).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from locstatus.errors import InvalidInput, Unauthorized

from .auth import authorize
from .guard import split_host
from .problems import ProblemError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_bearer = HTTPBearer(
    auto_error=False,
    description="LOCSTATUS_API_TOKEN; not needed from a --backbeat-trust network",
)


WIDEST = {4: 8, 6: 32}
"""The shortest prefix per IP version that ``--backbeat-trust`` takes without a warning;
a prefix of 0 (``0.0.0.0/0``, ``::/0``: every address) is refused."""


class TrustedPeers:
    """The networks whose peers may call the Backbeat mutations without the bearer token.

    ``networks``: CIDR blocks or single addresses (``10.0.0.0/8``, ``127.0.0.1``, ``::1``);
    ``hosts``: the ``--allow-host`` names, the ``Host`` names besides address literals and
    ``localhost`` a browser's tokenless request from those networks may name
    (:meth:`host_refusal`). Raises :class:`InvalidInput` naming the entry that does not parse,
    or one that contains every address (``0.0.0.0/0``, ``::/0``).

    Usage::

        peers = TrustedPeers(["10.100.0.0/16"])
        peers.trusts("10.100.3.4")   # True
        peers.trusts("192.0.2.1")    # False
    """

    def __init__(self, networks: Iterable[str] = (), hosts: Iterable[str] = ()) -> None:
        self.hosts = frozenset(n.strip().lower().rstrip(".").strip("[]") for n in hosts)
        parsed: list[Network] = []
        for entry in networks:
            try:
                parsed.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise InvalidInput(
                    f"invalid --backbeat-trust {entry[:80]!r}: expected an address or a CIDR "
                    "block such as 10.100.0.0/16 (the network CloudServer connects from)"
                ) from None
        for net in parsed:
            if net.prefixlen == 0:
                raise InvalidInput(
                    f"refused --backbeat-trust {net}: it contains every address, so anyone "
                    "could pause and resume through the Backbeat routes without the token; "
                    "give the network CloudServer connects from, such as 10.100.0.0/16"
                )
        self.networks: tuple[Network, ...] = tuple(parsed)

    @property
    def wide(self) -> tuple[Network, ...]:
        """The networks wider than :data:`WIDEST` for their family (``10.0.0.0/7``,
        ``2001::/31``): accepted, and the sidecar warns at start (more than one private range,
        or a provider's allocation, is seldom where CloudServer alone connects from)."""
        return tuple(n for n in self.networks if n.prefixlen < WIDEST[n.version])

    def __bool__(self) -> bool:
        return bool(self.networks)

    def describe(self) -> str:
        """The networks as an operator gave them, comma-separated (``10.100.0.0/16, ::1``);
        ``none`` when there are none."""
        return ", ".join(str(n) for n in self.networks) or "none"

    def trusts(self, peer: str | None) -> bool:
        """True when ``peer`` (an address literal, or None when unknown) is in a network."""
        if peer is None or not self.networks:
            return False
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in net for net in self.networks)

    def host_refusal(self, host: str | None) -> str | None:
        """Why a tokenless mutation a browser sent from a trusted peer is refused for the
        ``Host`` header ``host``, or None when that Host is an address literal, ``localhost``
        or an ``--allow-host`` name: a re-pointed DNS name (DNS rebinding) is none of them."""
        if "*" in self.hosts:
            return None  # --insecure on a non-loopback address: every Host is served anyway
        parsed = split_host(host or "")
        name = parsed[0] if parsed is not None else ""
        if name == "localhost" or name in self.hosts:
            return None
        try:
            ipaddress.ip_address(name)
            return None
        except ValueError:
            pass
        return (
            f"Host {(host or '')[:80]!r} is not an address or an --allow-host name: a browser's "
            "Backbeat-route mutation (it carries Origin) from a --backbeat-trust network needs "
            "a bearer token unless it names the sidecar by address, as a page whose DNS name "
            "was re-pointed here (DNS rebinding) could send it; give CloudServer's name for "
            "the sidecar with --allow-host"
        )


async def authorize_mutation(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> None:
    """A Backbeat-route mutation: accepted without the token from a trusted peer
    (:class:`TrustedPeers` in ``app.state.backbeat_trust``), else as :func:`authorize` decides
    (401 without a bearer token, 403 for a wrong one); the principal, if any, is kept in
    ``request.state.principal`` for the change's actor. A request signed for CloudServer
    (``AWS4-HMAC-SHA256``) from an untrusted peer is told why it is refused."""
    peers: TrustedPeers = getattr(request.app.state, "backbeat_trust", TrustedPeers())
    peer = request.client.host if request.client else None
    if peers.trusts(peer):
        # no token needed; one presented that names an operator makes it the actor, anything
        # else leaves no principal: the change's actor is then the peer (backbeat:<address>)
        principals = request.app.state.locstatus.principals
        who = (
            principals.authenticate(credentials.credentials)
            if credentials is not None and credentials.credentials and principals.enabled
            else None
        )
        request.state.principal = who if who is not None and who.may("operate") else None
        if request.state.principal is None and "origin" in request.headers:
            refusal = peers.host_refusal(request.headers.get("host"))
            if refusal is not None:  # a browser's page, maybe under a re-pointed name
                raise ProblemError(421, "misdirected request", refusal,
                                   type_="urn:locstatus:misdirected-request")
        return
    scheme = request.headers.get("authorization", "").split(" ", 1)[0].lower()
    enabled = request.app.state.locstatus.principals.enabled
    outside = (f"the peer {peer or '(unknown address)'} is not in a --backbeat-trust network "
               f"(trusted: {peers.describe()})")
    if scheme.startswith("aws") and enabled:
        raise Unauthorized(
            "a request signed for CloudServer (AWS signature) is accepted only from a peer in "
            f"a --backbeat-trust network; {outside}, so it needs the sidecar's bearer token"
        )
    if enabled and (credentials is None or not credentials.credentials):
        raise Unauthorized(
            f"{outside}: a Backbeat-route mutation from it needs an Authorization header with "
            "a bearer token of the sidecar (LOCSTATUS_API_TOKEN or LOCSTATUS_API_TOKENS_FILE; "
            "docs/http.md, \"Putting locstatus where Backbeat's API server was\")"
        )
    await authorize(request, credentials)
