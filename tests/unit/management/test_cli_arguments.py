"""The ``meshmq`` command's answers to arguments it cannot use, called in-process
(``meshmq.cli.main.main``) before anything is dialed: one line on stderr naming the
option and what to write instead, exit status 2, never a traceback; and the
configuration errors ``broker`` and ``witness`` report before they start."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from meshmq.cli.main import main
from meshmq.core.passwords import parse_hash


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``meshmq ARGS``."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_line(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code, out, err = run(capsys, *args)
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, err
    return code, err.rstrip("\n")


# Each row: arguments, and the line the command must answer with (exit status 2).
@pytest.mark.parametrize(("args", "line"), [
    pytest.param(("send", "/queue/q", "x", "--header", "no-equals-sign"),
                 "meshmq send: --header 'no-equals-sign' is not NAME=VALUE", id="send-header"),
    pytest.param(("send", "/queue/q", "x", "--header", "=v"),
                 "meshmq send: --header '=v' is not NAME=VALUE", id="send-header-no-name"),
    pytest.param(("send", "/queue/q", "x", "--url", "a:b:c"),
                 "meshmq send: --url 'a:b:c' is not HOST:PORT (a port is 0 to 65535)",
                 id="send-url"),
    pytest.param(("receive", "/queue/q", "--url", "127.0.0.1:70000"),
                 "meshmq receive: --url '127.0.0.1:70000' is not HOST:PORT (a port is 0 to "
                 "65535)", id="receive-port-range"),
    pytest.param(("receive", "/topic/t", "--durable", "sub"),
                 "meshmq receive: --durable needs --client-id (a durable subscription "
                 "belongs to one client id)", id="durable-without-client-id"),
    pytest.param(("receive", "/queue/q", "--key", "client.key"),
                 "meshmq receive: --key needs --cert (the client certificate the key "
                 "belongs to)", id="key-without-cert"),
    pytest.param(("broker", "--stomp", "host:port"),
                 "meshmq broker: --stomp 'host:port' is not HOST:PORT (a port is 0 to "
                 "65535)", id="broker-stomp"),
    pytest.param(("broker", "--mqtt", ":65536"),
                 "meshmq broker: --mqtt ':65536' is not HOST:PORT (a port is 0 to 65535)",
                 id="broker-mqtt"),
    pytest.param(("broker", "--management", "[::1"),
                 "meshmq broker: --management '[::1' is not HOST:PORT (a port is 0 to "
                 "65535)", id="broker-management"),
    pytest.param(("stat", "--url", "127.0.0.1:99999"),
                 "meshmq stat: --url '127.0.0.1:99999' is not HOST:PORT, http://HOST:PORT "
                 "or https://HOST:PORT", id="stat-port-range"),
    pytest.param(("stat", "--url", "http://[::1"),
                 "meshmq stat: --url 'http://[::1' is not HOST:PORT, http://HOST:PORT or "
                 "https://HOST:PORT", id="stat-unclosed-bracket"),
    pytest.param(("queue", "list", "--url", "stomp://127.0.0.1:61613"),
                 "meshmq queue: --url 'stomp://127.0.0.1:61613' is not HOST:PORT, "
                 "http://HOST:PORT or https://HOST:PORT", id="admin-stomp-url"),
    pytest.param(("connection", "list", "--cafile", "/nonexistent/ca.pem"),
                 "meshmq connection: --cafile /nonexistent/ca.pem: no such file",
                 id="admin-missing-cafile"),
])
def test_an_argument_that_cannot_be_used_is_one_line(capsys: pytest.CaptureFixture[str],
                                                     args: tuple[str, ...],
                                                     line: str) -> None:
    assert one_line(capsys, *args) == (2, line)


def test_a_ca_file_for_plain_http_is_refused(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    assert one_line(capsys, "bridge", "list", "--url", "127.0.0.1:8161", "--cafile",
                    str(ca)) == (2, "meshmq bridge: --cafile is for an HTTPS endpoint: give "
                                    "--url https://HOST:PORT")


def test_a_missing_ca_file_for_stomp_is_one_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    assert one_line(capsys, "send", "/queue/x", "b", "--cafile", str(missing)) == (
        2, f"meshmq send: cannot load CA file {missing}: No such file or directory")


def test_a_bad_configuration_file_names_file_line_and_option(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[broker]\nname = \"x\"\n\n[stomp]\nmax_fram_size = 10\n")
    assert one_line(capsys, "broker", "--config", str(config)) == (
        2, f"meshmq: configuration error: {config}:5, option 'stomp.max_fram_size': unknown "
           "option 'stomp.max_fram_size'; did you mean 'max_frame_size'?")


def test_a_configuration_file_of_an_unknown_kind_is_named(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("name: x\n")
    code, line = one_line(capsys, "broker", "--config", str(config))
    assert code == 2
    assert line.startswith(f"meshmq: configuration error: {config}") and ".toml" in line


def test_a_witness_needs_replicated_ha(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[ha]\nmode = "shared"\n')
    assert one_line(capsys, "witness", "--config", str(config)) == (
        2, f"{config}: a witness needs [ha] mode = \"replicated\"")


@pytest.mark.parametrize("stdin", [pytest.param("", id="nothing"),
                                   pytest.param("\n", id="empty-line"),
                                   pytest.param("\r\n", id="empty-crlf-line")])
def test_passwd_refuses_an_empty_password(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch,
                                          stdin: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert one_line(capsys, "passwd") == (
        2, "meshmq passwd: the password is empty; nothing printed")


def test_passwd_hashes_the_piped_line_without_its_line_end(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret pw\r\nignored\n"))
    code, out, err = run(capsys, "passwd")
    assert (code, err) == (0, "")
    hashed = out.rstrip("\n")
    assert "\n" not in hashed and hashed.startswith("scrypt$")
    assert parse_hash(hashed).matches("s3cret pw")  # not "s3cret pw\r"
