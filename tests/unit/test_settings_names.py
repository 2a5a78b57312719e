"""Names and addresses in the settings are refused at start when they could only fail
later (second fresh-user and breaker passes): a token's name holding a NUL made every
action of its holder a 400 blaming the request (PostgreSQL refuses the NUL in the audit
row's actor); an empty or malformed listening host gave the authentication refusal or
"Name or service not known" without naming the setting; a NUL in ``data_dir`` was a
traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from controlroom.config import Settings
from controlroom.site import SiteSettings

TOKEN = "t" * 20


def listening(model: type[Settings] | type[SiteSettings], host: str) -> Settings | SiteSettings:
    if model is SiteSettings:
        return SiteSettings(site_id="plant-7", host=host)
    return Settings(host=host)


@pytest.mark.parametrize("name", ["nul\x00op", "line\nfeed", "   ", "tab\there"])
def test_a_token_name_with_a_control_character_or_only_space_is_refused(name: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(auth_tokens=[{"name": name, "token": TOKEN, "role": "operator"}])
    [error] = refused.value.errors()
    assert error["loc"] == ("auth_tokens", 0, "name")


def test_a_token_name_in_any_script_is_taken() -> None:
    settings = Settings(auth_tokens=[{"name": "Zoë Ørsted", "token": TOKEN, "role": "admin"}])
    assert settings.auth_tokens[0].name == "Zoë Ørsted"


@pytest.mark.parametrize(
    "host", ["", " ", "not_a_host", "http://0.0.0.0", "host:8080", "a b", "[::1", "[x]"]
)
@pytest.mark.parametrize("model", [Settings, SiteSettings])
def test_a_listening_host_that_is_no_name_or_address_is_refused(
    model: type[Settings] | type[SiteSettings], host: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        listening(model, host)
    [error] = refused.value.errors()
    assert error["loc"] == ("host",)
    assert "a host name or an IP address" in error["msg"]


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "0.0.0.0", "::", "::1", "[::1]", "localhost", "ops-1.example"]
)
@pytest.mark.parametrize("model", [Settings, SiteSettings])
def test_listening_hosts_are_taken(model: type[Settings] | type[SiteSettings], host: str) -> None:
    assert listening(model, host).host == host


@pytest.mark.parametrize("host", ["::1", "[::1]", "127.0.0.1"])
def test_every_listening_host_the_settings_take_can_be_listened_on(host: str) -> None:
    """Fresh-user pass (third): ``--host '[::1]'`` passed the settings, then could not be
    listened on ("Name or service not known")."""
    from controlroom.runtime.sockets import listen

    with listen(host, 0) as listener:
        assert listener.getsockname()[0] in ("::1", "127.0.0.1")


def test_a_data_dir_with_a_nul_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(data_dir="a\x00b")
    [error] = refused.value.errors()
    assert error["loc"] == ("data_dir",)


def test_an_smtp_password_without_a_username_is_refused() -> None:
    """Fresh-user pass: taken, and the password never used: the dispatcher logs in only
    with a username."""
    with pytest.raises(ValidationError, match="a password needs a username"):
        Settings(notifications={"smtp": {"host": "mail.example", "password": "pw"}})


def test_a_site_agent_backoff_cap_below_its_base_is_refused() -> None:
    """Fresh-user pass: ``backoff_cap = "PT1M"`` below ``backoff_base = "PT1H"`` was taken;
    every wait would be the cap (a minute), never the hour asked for."""
    with pytest.raises(ValidationError, match=r"backoff_cap \(60 s\) is below backoff_base"):
        SiteSettings(site_id="plant-7", backoff_base=3600, backoff_cap=60)


def test_a_notification_backoff_cap_below_its_base_is_refused() -> None:
    with pytest.raises(ValidationError, match="backoff_cap is below backoff_base"):
        Settings(notifications={"backoff_base": "PT1H", "backoff_cap": "PT1M"})


@pytest.mark.parametrize("version", ["latest", "6.15", "v6.15.0"])
def test_a_servicecontrol_version_that_is_no_version_is_refused_with_the_form(
    version: str,
) -> None:
    """Fresh-user pass: the refusal showed the pattern, ``^[0-9]+\\.[0-9]+\\.[0-9]+$``."""
    with pytest.raises(ValidationError) as refused:
        Settings(servicecontrol_api_version=version)
    [error] = refused.value.errors()
    assert "three numbers in ASCII digits, such as 6.15.0" in error["msg"]


@pytest.mark.parametrize("sender", ["Ops <ops@example.org>", "ops", "a@b@c"])
def test_an_smtp_sender_that_is_no_plain_address_is_refused_with_the_form(sender: str) -> None:
    """Fresh-user pass: the refusal showed a regular expression."""
    with pytest.raises(ValidationError) as refused:
        Settings(notifications={"smtp": {"host": "mail.example", "sender": sender}})
    [error] = refused.value.errors()
    assert "one plain address, local@domain" in error["msg"]


@pytest.mark.parametrize(
    "host", ["mail example.org", "smtp://mail.example.org", "mail..example", ""]
)
def test_an_smtp_host_that_is_no_host_is_refused_with_the_form(host: str) -> None:
    """Fresh-user pass (second): the refusal showed a regular expression."""
    with pytest.raises(ValidationError) as refused:
        Settings(notifications={"smtp": {"host": host}})
    [error] = refused.value.errors()
    assert error["loc"] == ("notifications", "smtp", "host")
    assert "the mail server's host name or IP address" in error["msg"]


@pytest.mark.parametrize(
    "host", ["mail", "mail.example.org", "10.0.0.5", "::1", "m\u00fcnchen.example"]
)
def test_an_smtp_host_name_or_address_is_taken(host: str) -> None:
    assert Settings(notifications={"smtp": {"host": host}}).notifications.smtp.host == host


@pytest.mark.parametrize("site_id", ["a\x00b", " ", "north\n", " north", "north "])
def test_a_site_id_that_is_no_printable_name_is_refused_at_central_and_at_the_agent(
    site_id: str,
) -> None:
    """Breaker pass (second): a site id holding a NUL was taken, then every reconciliation
    pass failed on PostgreSQL (text cannot hold a NUL) with no last error shown; an id of
    spaces was taken too."""
    from controlroom.site import SiteSettings

    with pytest.raises(ValidationError) as refused:
        Settings(sites=[{"id": site_id, "base_url": "http://north.example:8090"}])
    [error] = refused.value.errors()
    assert error["loc"] == ("sites", 0, "id")
    assert "a site's id is printable text" in error["msg"]
    with pytest.raises(ValidationError, match="a site's id is printable text"):
        SiteSettings(site_id=site_id)


@pytest.mark.parametrize("node", ["a\x00b", " ", "", "node-1\n", " node-1", "node-1 "])
def test_an_agent_node_that_is_no_printable_name_is_refused(node: str) -> None:
    """Breaker pass: ``NODE=" node-1"`` was taken, and the agent's calls carried another
    ``source_node`` than the node's own in every KPI per node."""
    from controlroom.site import SiteSettings

    with pytest.raises(ValidationError) as refused:
        SiteSettings(site_id="plant-7", node=node)
    [error] = refused.value.errors()
    assert error["loc"] == ("node",)
    assert "a node's name is printable text" in error["msg"]


def test_an_agent_node_of_printable_text_is_taken() -> None:
    from controlroom.site import SiteSettings

    assert SiteSettings(site_id="plant-7", node="node 1 (east)").node == "node 1 (east)"


def test_an_intake_cgroup_without_workers_is_refused(tmp_path: Path) -> None:
    """Fresh-user pass (sixth): with ``workers = 0`` intake runs in serve, which never
    joins the cgroup: the setting was silently void."""
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "cpu.shares").write_text("")
    with pytest.raises(ValidationError) as refused:
        Settings(ingestion={"cpu_cgroup": tmp_path, "workers": 0})
    [error] = refused.value.errors()
    assert error["loc"] == ("ingestion",)
    assert "cpu_cgroup needs workers: with workers = 0 intake runs in serve" in error["msg"]
