"""The gRPC door's peer addresses as grpc writes them and as the kernel's TCP tables write them must meet
(server/grpc/peers.py closes idle connections found by that match)."""
from __future__ import annotations

from server.grpc.peers import _proc_address, peer_address


def test_grpc_peer_strings_parse_to_addresses() -> None:
    assert peer_address("ipv4:127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert peer_address("ipv6:[::1]:443") == ("::1", 443)
    assert peer_address("ipv6:[::ffff:127.0.0.1]:5000") == ("127.0.0.1", 5000)   # a v4 peer on a dual-stack port
    assert peer_address("unix:/tmp/socket") is None
    assert peer_address("ipv4:garbage") is None


def test_kernel_table_addresses_parse_to_the_same_form() -> None:
    assert _proc_address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _proc_address("00000000000000000000000001000000:01BB") == ("::1", 443)
    assert _proc_address("0000000000000000FFFF00000100007F:1388") == ("127.0.0.1", 5000)
