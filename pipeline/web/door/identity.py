"""Who a request belongs to: one function (``caller_of``) for the front door, the handler and MCP.

A request's *address* is its TCP peer's, unless that peer is a trusted proxy (``--trusted-proxies``):
then it is the rightmost address of ``X-Forwarded-For`` (every line of it, in order) that no
trusted proxy added. A proxy appends the address it saw, so whatever a client wrote into the header
itself stays to the left of it and is never read. An IPv6 client is keyed by its /64 (one
customer's network: a client can pick any of its 2^64 addresses), an IPv4 client by its address.

The *identity* the app keys fairness, rate limits, sessions and disk shares by:

- a logged-in Hugging Face user: ``hf:NAME`` (one account is one person);
- a ``--auth`` login: ``user:NAME@NETWORK``, so two people sharing one login from two places are
  two users;
- else the address: ``addr:NETWORK``.

Who is *charged* (``Caller.account``: the image quota, and the write rate and failed logins of a
request without a login) is wider: a login wherever it connects from, else the address with an
IPv6 client by its /56 (a /48 holds 65,536 /64s: keyed by /64, one customer would be 65,536 accounts).

What the proxies in front of the app send (``docs`` and README "Security"): on Spaces the app sees
its proxy's internal address (10.x) and the client's address at the right end of
``X-Forwarded-For``; ``--share``'s tunnel (frpc) connects from 127.0.0.1 and its server, frp's
HTTP vhost (Go's ``ReverseProxy``), appends the address it saw (fatedier/frp#1767). ``auto``
trusts 127.0.0.1 and ::1, and on Spaces also the private ranges its proxy comes from (``config.proxy_networks``).

Gradio's MCP server calls the app back over loopback with the MCP caller's headers. The front door
seals the caller's address into that call (``seal``: an HMAC under a key of this process), and
``caller_of`` believes a seal, never a caller-supplied ``X-Forwarded-For``, on the loopback hop.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ...config import ProxyNetwork, Settings, proxy_networks

CHARGED_PREFIX = 56  # an IPv6 network charged as one (``wide_network_of``)
SEAL_HEADER = "x-t2i-caller"  # set by the front door on MCP requests only; any client-sent one is dropped
_KEY = secrets.token_bytes(32)  # this process's; a seal never outlives the process that made it


@dataclass(frozen=True)
class TrustedProxies:
    """The peers whose ``X-Forwarded-For`` is believed."""

    networks: tuple[ProxyNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str | None, *, on_spaces: bool = False) -> TrustedProxies:
        """``auto`` (None or ""), ``none``, or comma-separated addresses and CIDRs (``config.proxy_networks``)."""
        return cls(proxy_networks(text, on_spaces=on_spaces))

    @classmethod
    def from_settings(cls, settings: Settings) -> TrustedProxies:
        return cls(settings.trusted_proxy_networks())

    def trusts(self, address: str) -> bool:
        ip = _ip(address)
        return ip is not None and any(ip.version == n.version and ip in n for n in self.networks)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the client's address (resolved through trusted proxies) and its login."""

    address: str
    login: str | None = None  # a --auth user name
    hf_user: str | None = None  # a Hugging Face OAuth user name
    call: str = ""  # an MCP tool call the front door follows (its job stops when the caller goes); not identity

    @property
    def network(self) -> str:
        """The address as the app counts it: IPv6 by /64, IPv4 as it is; "" when unknown."""
        return network_of(self.address)

    @functools.cached_property
    def key(self) -> str:
        """The identity (see the module doc)."""
        if self.hf_user:
            return f"hf:{self.hf_user}"
        if self.login:
            return f"user:{self.login}@{self.network}"
        return f"addr:{self.network}"

    @functools.cached_property
    def account(self) -> str:
        """Who is charged for the work a request asks for: the quota's key, and without a login the
        write rate's and the failed logins' too. A login is one account wherever it connects from
        (six addresses share its quota); else the address's wider network (``wide_network_of``)."""
        if self.hf_user:
            return f"hf:{self.hf_user}"
        if self.login:
            return f"user:{self.login}"
        return f"addr:{wide_network_of(self.address)}"


@functools.lru_cache(maxsize=65536)
def wide_network_of(address: str) -> str:
    """The address as the app charges it (the quota, the write rate, failed logins): IPv6 by /56, the
    smallest allocation a provider gives one customer (a /48 holds 65,536 /64s, a /56 256), IPv4 as it is."""
    ip = _ip(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/{CHARGED_PREFIX}", strict=False))
    return network_of(address)


@functools.lru_cache(maxsize=65536)
def network_of(address: str) -> str:
    ip = _ip(address)
    if ip is None:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def forwarded_hops(lines: Iterable[str]) -> list[str]:
    """Every ``X-Forwarded-For`` line, in order, split into hops (left: nearest the client)."""
    return [hop.strip() for line in lines for hop in line.split(",") if hop.strip()]


def client_address(peer: str, forwarded: Iterable[str], trusted: TrustedProxies) -> str:
    """The client's address: the peer, or behind trusted proxies the rightmost hop none of them added."""
    if not trusted.trusts(peer):
        return peer
    for hop in reversed(forwarded_hops(forwarded)):
        hop = _strip_port(hop)
        if not trusted.trusts(hop):
            return hop if _ip(hop) is not None else peer  # garbage in the header names nobody: the proxy
    return peer


def seal(address: str, call: str = "") -> str:
    """``address|call|mac``: the front door's word, on an MCP request, for who the caller is."""
    mac = hmac.new(_KEY, f"{address}|{call}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{address}|{call}|{mac}"


def unseal(value: str | None) -> tuple[str, str] | None:
    """(address, call) of a seal this process made, or None for anything else."""
    if not value or value.count("|") != 2:
        return None
    address, call, mac = value.split("|")
    if not hmac.compare_digest(seal(address, call).rsplit("|", 1)[1], mac):
        return None
    return address, call


def caller_of(
    peer: str,
    headers: Sequence[tuple[str, str]] | Mapping[str, str],
    trusted: TrustedProxies,
    *,
    login: str | None = None,
    hf_user: str | None = None,
) -> Caller:
    """Who sent a request with TCP peer ``peer`` and these headers (all lines, lower-case names)."""
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    if _is_loopback(peer):
        sealed = unseal(next((v for k, v in pairs if k.lower() == SEAL_HEADER), None))
        if sealed is not None:
            return Caller(sealed[0], login, hf_user, sealed[1])
    forwarded = [v for k, v in pairs if k.lower() == "x-forwarded-for"]
    return Caller(client_address(peer, forwarded, trusted), login, hf_user)


@functools.lru_cache(maxsize=65536)  # a request's addresses are parsed a few times, and they repeat
def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None


def _strip_port(hop: str) -> str:
    """``1.2.3.4:5678`` and ``[2001:db8::1]:443`` (some proxies write ports) -> the address."""
    if hop.startswith("[") and "]" in hop:
        return hop[1 : hop.index("]")]
    if hop.count(":") == 1:
        return hop.split(":", 1)[0]
    return hop


def _is_loopback(address: str) -> bool:
    ip = _ip(address)
    return ip is not None and ip.is_loopback
