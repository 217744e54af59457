"""Attack: reading bearer tokens from where they were put (issue 21, item 3).

- ``thinkray serve --token P=T`` shows the token to every user of the machine (``ps``):
  refused, with the way that works (``--token-file``, ``$THINKRAY_TOKENS``).
- A Serve application's ``args`` are readable through Serve's REST config: tokens
  there are refused; the shipped ``serve_config.yaml`` holds none and binds loopback.
- An example's placeholder token copied to a server: startup refuses it.
No Ray: only the command line's and the builders' checks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from thinkray.actors import cli
from thinkray.actors.ingress.config import PLACEHOLDER, AgentRoute, IngressConfig

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Zq8vW1xY2"


def serve_args(**given: object) -> argparse.Namespace:
    fields = {"storage_root": "/tmp/x", "agent": None, "token": None, "token_file": None}
    return argparse.Namespace(**{**fields, "cors_origin": None, **given})


def test_a_token_on_the_command_line_is_refused(capsys):
    code = cli.main(["serve", "--port", "1", "--token", f"alice={SECRET}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "THINKRAY_TOKENS" in err
    assert SECRET not in err


def test_tokens_come_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("THINKRAY_TOKENS", raising=False)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# who=token\nalice={SECRET}\nbob=b0b-Token-1234\n")
    config, generated = cli.serve_config(serve_args(token_file=str(tokens)))
    assert config.tokens == {SECRET: "alice", "b0b-Token-1234": "bob"} and generated is None
    monkeypatch.setenv("THINKRAY_TOKENS", f"carol={SECRET}")
    config, generated = cli.serve_config(serve_args())
    assert config.tokens == {SECRET: "carol"} and generated is None


def test_the_shipped_serve_config_has_no_token_and_binds_loopback():
    text = (ROOT / "actors" / "ingress" / "serve_config.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["http_options"]["host"] not in ("0.0.0.0", "::")
    (app,) = config["applications"]
    assert "tokens" not in app["args"]
    assert not PLACEHOLDER.search(yaml.safe_dump(config))


def test_serve_args_with_tokens_are_refused():
    from thinkray.actors.ingress.deploy import app_builder

    args = {
        "storage_root": "/tmp/x",
        "agents": {"chat": {"agent_cls": "tests.agents:ScriptAgent", "namespace": "chat"}},
        "tokens": {SECRET: "alice"},
    }
    with pytest.raises(ValueError, match="tokens_file") as refused:
        app_builder(args)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "token", ["change-me-token-alice", "CHANGEME", "replace_me_123", "your-token-here"]
)
def test_startup_refuses_a_placeholder_token(token, tmp_path, monkeypatch):
    from thinkray.actors.ingress.app import build_app

    route = {"chat": AgentRoute(agent_cls="tests.agents:ScriptAgent", namespace="chat")}
    with pytest.raises(ValidationError, match="placeholder"):
        IngressConfig(storage_root=str(tmp_path), agents=route, tokens={token: "alice"})
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice={token}\n")
    with pytest.raises(ValueError, match="placeholder"):
        build_app(IngressConfig(storage_root=str(tmp_path), agents=route, tokens_file=str(tokens)))
    monkeypatch.setenv("THINKRAY_TOKENS", f"alice={token}")
    with pytest.raises(ValueError, match="placeholder"):
        build_app(IngressConfig(storage_root=str(tmp_path), agents=route))
    tokens.write_text(f"alice={token}\n")
    with pytest.raises(ValueError, match="placeholder"):
        cli.serve_config(serve_args(token_file=str(tokens)))
