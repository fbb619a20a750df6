"""The load generator's settings (testing/loadgen.py): each bad value is refused naming its field; loopback
addresses only, in every spelling."""
from __future__ import annotations

import pytest

from testing.loadgen import LoadConfig, LoadConfigError


@pytest.mark.parametrize("changes, field", [
    (dict(address="10.1.2.3:8001"), "address"),
    (dict(address="example.com:8001"), "address"),
    (dict(address="localhost"), "address"),
    (dict(clients=0), "clients"),
    (dict(seconds=0), "seconds"),
    (dict(mix=("classify", "translate")), "mix"),
    (dict(warmup_seconds=30), "warmup_seconds"),
    (dict(models={"summarise": "x"}), "models"),
])
def test_load_config_errors_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(LoadConfigError) as info:
        LoadConfig(**{"address": "127.0.0.1:8001", "seconds": 10, **changes}).validate()
    assert str(info.value).startswith(f"{field}:")


def test_loopback_addresses_are_accepted() -> None:
    for address in ("127.0.0.1:1", "localhost:1", "[::1]:1", "127.8.9.10:65000"):
        LoadConfig(address=address).validate()
