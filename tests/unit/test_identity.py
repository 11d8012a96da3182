"""Who a request belongs to (``identity.caller_of``): the peer, trusted proxies, logins, IPv6 networks, seals."""

from __future__ import annotations

import gradio as gr
import pytest

from pipeline.web.door.identity import SEAL_HEADER, Caller, TrustedProxies, caller_of, seal, unseal
from pipeline.web.page.handler import request_caller

AUTO = TrustedProxies.parse("auto")
SPACES = TrustedProxies.parse("auto", on_spaces=True)
PROXY = TrustedProxies.parse("10.0.0.0/8")


def key(peer: str, *forwarded: str, trusted: TrustedProxies = PROXY, login: str | None = None) -> str:
    return caller_of(peer, [("x-forwarded-for", f) for f in forwarded], trusted, login=login).key


def test_a_direct_client_is_its_own_address_whatever_it_writes() -> None:
    assert key("198.51.100.7") == key("198.51.100.7", "203.0.113.50") == "addr:198.51.100.7"
    assert key("127.0.0.2", "203.0.113.50", trusted=AUTO) == "addr:127.0.0.2"  # auto trusts 127.0.0.1 and ::1 only


def test_behind_a_trusted_proxy_the_rightmost_hop_no_proxy_added_over_every_header_line() -> None:
    assert key("10.0.0.1", "203.0.113.9, 10.0.0.1") == "addr:203.0.113.9"
    # what a client wrote itself stays to the left of what the proxies appended, on any line
    assert key("10.0.0.2", "203.0.113.50, 198.51.100.7", "10.0.0.1") == "addr:198.51.100.7"
    assert key("10.0.0.2", "203.0.113.50", "198.51.100.7, 10.0.0.3") == "addr:198.51.100.7"
    assert key("10.0.0.2", "198.51.100.7:4431") == "addr:198.51.100.7"  # a port some proxies write
    assert key("10.0.0.2", "not an address") == "addr:10.0.0.2"  # garbage names nobody: the proxy itself
    assert key("10.0.0.2") == key("10.0.0.2", "10.0.0.9") == "addr:10.0.0.2"  # only proxies: the peer


def test_spaces_trusts_its_private_proxy_and_share_its_loopback_tunnel() -> None:
    assert key("10.16.3.80", "203.0.113.9", trusted=SPACES) == "addr:203.0.113.9"
    assert key("10.16.3.80", "203.0.113.9", trusted=AUTO) == "addr:10.16.3.80"  # off Spaces: not trusted
    assert key("127.0.0.1", "203.0.113.9", trusted=AUTO) == "addr:203.0.113.9"  # --share's frpc
    assert key("10.0.0.1", "203.0.113.9", trusted=TrustedProxies.parse("none")) == "addr:10.0.0.1"
    with pytest.raises(ValueError, match="--trusted-proxies"):
        TrustedProxies.parse("10.0.0.0/33")


def test_ipv6_is_keyed_by_its_64_and_a_mapped_ipv4_by_its_ipv4() -> None:
    a, b = key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff:ffff:ffff:ffff")
    assert a == b == "addr:2001:db8:1:2::/64"
    assert key("2001:db8:1:3::1") != a
    assert key("::ffff:198.51.100.7") == "addr:198.51.100.7"


def test_one_login_from_two_places_is_two_users_and_an_hf_account_is_one() -> None:
    assert key("198.51.100.7", login="ann") == "user:ann@198.51.100.7"
    assert key("198.51.100.7", login="ann") != key("198.51.100.8", login="ann")
    assert Caller("198.51.100.7", "ann", hf_user="ann-hf").key == "hf:ann-hf"


def test_a_seal_is_believed_only_on_loopback_and_only_if_this_process_made_it() -> None:
    sealed = [(SEAL_HEADER, seal("203.0.113.9", "call1")), ("x-forwarded-for", "198.51.100.1")]
    inner = caller_of("127.0.0.1", sealed, AUTO)
    assert (inner.address, inner.call) == ("203.0.113.9", "call1")  # the MCP caller, not the forged header
    assert caller_of("198.51.100.7", sealed, AUTO).address == "198.51.100.7"  # not from loopback
    forged = [(SEAL_HEADER, "203.0.113.9|call1|" + "0" * 32)]
    assert unseal(forged[0][1]) is None and caller_of("127.0.0.1", forged, AUTO).address == "127.0.0.1"
    assert unseal("a|b") is None and unseal(None) is None


def test_the_handler_takes_the_front_doors_caller_and_adds_the_login() -> None:
    request = gr.Request(
        username="ann",
        session_hash="s1",
        client={"host": "10.0.0.1", "port": 1},
        headers={"x-forwarded-for": "203.0.113.9"},
    )
    assert request_caller(request, PROXY).key == "user:ann@203.0.113.9"  # resolved here when no door ran
    assert request_caller(None, PROXY) is None
