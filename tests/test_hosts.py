"""Every process as on its own machine (issue 28): each binds its host's address and only it,
advertises it in ZooKeeper, and presents a certificate ``ordq cert issue`` made naming it.

The "machines" are loopback aliases: Linux routes all of 127.0.0.0/8 to ``lo``, so a process
can bind 127.0.0.2 without root or any setup. One cluster for the module, deployed the way
docs/OPERATIONS.md ("Deploying on three machines") does it, from per-process config files:

    host1 127.0.0.2  ZooKeeper, TLS clients only (``ordq zk start --config``)
    host2 127.0.0.3  the master of g1 (``ordq broker run --config``)
    host3 127.0.0.4  the slave of g1 and a coordinator (``ordq coordinator run --config``)

Where 127.0.0.2 cannot be bound (another OS) the module is skipped with one line.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import grpc
import pytest
from cryptography import x509

from ordq.cli import build_parser, main
from ordq.commands import process_config
from ordq.commands.broker import broker_config
from ordq.common.errors import ConfigError
from ordq.common.proc import ManagedProcess
from ordq.common.security import Credentials, register, register_coordinators, unregister
from ordq.zk_server import ZkServer, four_letter_word, free_ports

HOST1, HOST2, HOST3 = "127.0.0.2", "127.0.0.3", "127.0.0.4"
ROOT = "/ordq"


def _aliases_bindable() -> bool:
    for host in (HOST1, HOST2, HOST3):
        with socket.socket() as sock:
            try:
                sock.bind((host, 0))
            except OSError:
                return False
    return True


needs_aliases = pytest.mark.skipif(
    not _aliases_bindable(), reason="loopback aliases 127.0.0.2-4 cannot be bound here (Linux routes 127/8 to lo)")


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, from /proc/net/tcp{,6}
    (an IPv4-mapped IPv6 address, as gRPC binds, is shown as its IPv4 address)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            # the kernel prints each 32-bit word in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
            addr = ipaddress.ip_address(packed)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            out.add((str(addr), int(hex_port, 16)))
    return out


def _toml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _tls(certs: Path, name: str, *, zookeeper: bool = True) -> str:
    cert, key = certs / f"{name}.pem", certs / f"{name}-key.pem"
    return (f'[tls]\ncert = "{cert}"\nkey = "{key}"\nca = "{certs / "ca.pem"}"\n'
            + ("zookeeper = true\n" if zookeeper else ""))


@attrs.frozen
class Deployed:
    folder: Path
    zk: ZkServer
    zk_hosts: str
    processes: dict[str, ManagedProcess]  # master, slave, coordinator
    addresses: dict[str, str]  # what each announced (READY / SERVING)
    client: Credentials


def _issue(ca: Path, out: Path, name: str, role: str, *addrs: str) -> None:
    argv = ["cert", "issue", "--ca-dir", str(ca), "--out", str(out), "--name", name, "--role", role]
    for a in addrs:
        argv += ["--ip", a]
    assert main(argv) == 0


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    folder = tmp_path_factory.mktemp("hosts")
    ca, certs = folder / "ca", folder / "certs"
    assert main(["cert", "ca", "--out", str(ca)]) == 0
    (certs).mkdir()
    (certs / "ca.pem").write_bytes((ca / "ca.pem").read_bytes())  # what each machine gets
    _issue(ca, certs, "zk", "zookeeper", HOST1)
    _issue(ca, certs, "master", "broker", HOST2)
    _issue(ca, certs, "slave", "broker", HOST3)
    _issue(ca, certs, "coordinator", "coordinator", HOST3)
    _issue(ca, certs, "client", "client")
    [zk_port] = free_ports(1, host=HOST1)
    zk_file = _toml(folder / "host1" / "zk.toml",
                    f'dir = "zk"\n[[servers]]\nhost = "{HOST1}"\nclient_port = {zk_port}\n'
                    + _tls(certs, "zk", zookeeper=False))
    zk_hosts = f"{HOST1}:{zk_port}"
    assert main(["zk", "start", "--config", str(zk_file)]) == 0
    zk = ZkServer.load(folder / "host1" / "zk")
    processes: dict[str, ManagedProcess] = {}
    try:
        client = Credentials(ca_file=str(certs / "ca.pem"), cert_file=str(certs / "client.pem"),
                             key_file=str(certs / "client-key.pem"), zk_tls=True)
        register(zk_hosts, ROOT, client)  # where CLI commands and SDK clients of this test find them
        assert main(["--zk", zk_hosts, "group", "add", "g1"]) == 0
        for name, host, role in (("slave", HOST3, "slave"), ("master", HOST2, "master")):
            cfg = _toml(folder / name / "broker.toml",
                        f'zk = "{zk_hosts}"\ngroup = "g1"\nrole = "{role}"\nlisten = "{host}:0"\n'
                        f'metrics = "{host}:0"\ndata = "data"\nsession_timeout_s = 2.0\n' + _tls(certs, name))
            processes[name] = ManagedProcess(f"broker-{name}", [sys.executable, "-m", "ordq.cli", "broker", "run",
                                                                "--config", str(cfg)], run_dir=folder / "run")
        cfg = _toml(folder / "coordinator" / "coordinator.toml",
                    f'zk = "{zk_hosts}"\nlisten = "{HOST3}:0"\nmetrics = "{HOST3}:0"\n' + _tls(certs, "coordinator"))
        processes["coordinator"] = ManagedProcess("coordinator", [sys.executable, "-m", "ordq.cli", "coordinator",
                                                                  "run", "--config", str(cfg)], run_dir=folder / "run")
        addresses = {}
        for proc in processes.values():  # all at once: each waits for what it needs by itself
            proc.start()
        for name, proc in processes.items():
            line = proc.wait_for_line("SERVING " if name == "coordinator" else "READY ", timeout_s=90)
            addresses[name] = line.split()[0]
        processes["coordinator"].wait_for_line("READY coordinator", timeout_s=60)
        # clients named by (zk_hosts, ROOT) find the coordinator by its address (issue 37)
        register_coordinators(zk_hosts, ROOT, [addresses["coordinator"]])
        yield Deployed(folder, zk, zk_hosts, processes, addresses, client)
    finally:
        for proc in processes.values():
            proc.stop()
        zk.destroy()


@needs_aliases
@pytest.mark.zk
def test_each_process_binds_and_advertises_only_its_own_address(deployed: Deployed,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    own = {"master": HOST2, "slave": HOST3, "coordinator": HOST3}
    for name, proc in deployed.processes.items():
        assert proc.pid is not None
        bound = listening(proc.pid)
        # the service and the metrics endpoint, both on the host's address and no other
        assert len(bound) >= 2 and {a for a, _ in bound} == {own[name]}, (name, bound)
        assert deployed.addresses[name].startswith(f"{own[name]}:")
    [zk_pid] = [st.pid for st in deployed.zk.status()]
    assert zk_pid is not None
    assert {a for a, _ in listening(zk_pid)} == {HOST1}
    # ZooKeeper holds the advertised addresses: where clients find the brokers
    capsys.readouterr()
    assert main(["--zk", deployed.zk_hosts, "--json", "group", "list"]) == 0
    [g1] = json.loads(capsys.readouterr().out)
    assert (g1["master"], g1["slave"]) == (deployed.addresses["master"], deployed.addresses["slave"])


@needs_aliases
@pytest.mark.zk
def test_produce_and_consume_across_the_hosts(deployed: Deployed, capsys: pytest.CaptureFixture[str]) -> None:
    zk = ["--zk", deployed.zk_hosts]
    assert main([*zk, "queue", "create", "orders"]) == 0
    assert main([*zk, "produce", "orders", "--count", "300"]) == 0
    # a subscription is made by the elected coordinator (dialled at its advertised address)
    assert main([*zk, "consume", "orders", "-s", "s1", "--count", "300", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "acked 300 of 300" in err and "300" in err.splitlines()[-1], err


def _health(address: str, creds: Credentials, name: str | None = None) -> grpc.RpcError | None:
    """Call the broker's Health at ``address``, checking its certificate against ``name``
    (default: the address's host, as every client does); the error, or None."""
    from ordq.common.security import channel
    from ordq.wire import ordq_pb2 as pb
    from ordq.wire import ordq_pb2_grpc as pb_grpc

    options = [("grpc.ssl_target_name_override", name)] if name else []
    with channel(address, creds, options) as ch:
        try:
            pb_grpc.BrokerStub(ch).Health(pb.HealthRequest(), timeout=10)  # type: ignore[no-untyped-call]
        except grpc.RpcError as exc:
            return exc
    return None


@needs_aliases
@pytest.mark.zk
def test_a_certificate_is_accepted_at_the_address_it_names_and_refused_at_another(deployed: Deployed) -> None:
    master = deployed.addresses["master"]  # 127.0.0.3:port, its certificate names 127.0.0.3
    assert _health(master, deployed.client) is None
    for other in ("127.0.0.9", "host2.example"):  # names its certificate does not carry
        refused = _health(master, deployed.client, name=other)
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, other
    # ZooKeeper's certificate too: it names 127.0.0.2, where it is dialled, and nothing else
    port = deployed.zk.specs[0].client_port
    assert "Mode: standalone" in four_letter_word(port, tls=deployed.client, host=HOST1)
    ctx = ssl.create_default_context(cafile=deployed.client.ca_file)
    ctx.load_cert_chain(str(deployed.client.cert_file), deployed.client.key_file)
    with socket.create_connection((HOST1, port), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        ctx.wrap_socket(raw, server_hostname="127.0.0.9")


# -- ordq cert issue, config files: no cluster ----------------------------------------------


def test_cert_issue_names_the_addresses_and_writes_the_key_0600(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    assert main(["cert", "ca", "--out", str(ca)]) == 0
    assert stat.S_IMODE((ca / "ca-key.pem").stat().st_mode) == 0o600
    assert main(["cert", "ca", "--out", str(ca)]) == 1  # never replaced
    # under a permissive umask (in a process of its own: the umask is the whole process's), so
    # the mode seen is the one the key is created with
    argv = ["cert", "issue", "--ca-dir", str(ca), "--out", str(tmp_path / "o"), "--name", "b1",
            "--ip", "10.0.0.7", "--ip", "fd00::7", "--dns", "host7.example"]
    code = f"import os, sys; os.umask(0); from ordq.cli import main; sys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((tmp_path / "o" / "b1-key.pem").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((tmp_path / "o" / "b1.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"10.0.0.7", "fd00::7"}
    assert san.get_values_for_type(x509.DNSName) == ["host7.example"]
    assert cert.subject.rfc4514_string() == "CN=ordq-broker"


@pytest.mark.parametrize(("argv", "says"), [
    (["--ip", "10.0.0.300"], "--ip '10.0.0.300' is not an IP address"),
    (["--ip", "host1"], "--ip 'host1' is not an IP address"),
    (["--dns", "10.0.0.1"], "--dns '10.0.0.1' is not a DNS name"),
    (["--dns", "bad_name!"], "is not a DNS name"),
    ([], "must name where it is dialled"),
    (["--ip", "10.0.0.1", "--name", "../x"], "certificate name '../x'"),
])
def test_cert_issue_refuses_bad_input_with_one_line(tmp_path: Path, argv: list[str], says: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cert", "ca", "--out", str(tmp_path / "ca")]) == 0
    capsys.readouterr()
    assert main(["cert", "issue", "--ca-dir", str(tmp_path / "ca"), "--name", "b", *argv]) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1, err


def test_cert_issue_without_a_ca_says_how_to_make_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cert", "issue", "--ca-dir", str(tmp_path), "--name", "b", "--ip", "10.0.0.1"]) == 1
    assert "no CA in" in capsys.readouterr().err
    assert main(["--zk", "127.0.0.1:1", "cert", "issue", "--name", "b", "--ip", "10.0.0.1"]) == 1
    assert "no CA registered for 127.0.0.1:1/ordq: give --ca-dir" in capsys.readouterr().err
    (tmp_path / "ca.pem").write_text("only the certificate")
    assert main(["cert", "issue", "--ca-dir", str(tmp_path), "--name", "b", "--ip", "10.0.0.1"]) == 1
    assert "not its key" in capsys.readouterr().err


def _broker_args(*argv: str) -> object:
    return build_parser().parse_args(["broker", "run", *argv])


def test_a_broker_config_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    cfg = _toml(tmp_path / "etc" / "broker.toml",
                'zk = "10.0.0.1:2181,10.0.0.2:2181"\nroot = "/prod"\ngroup = "g7"\nrole = "slave"\n'
                'listen = "0.0.0.0:7000"\nadvertise = "10.0.0.2"\nmetrics = "10.0.0.2:9100"\ndata = "data"\n'
                'session_timeout_s = 3.5\nlink_listen = "0.0.0.0:7443"\nlink_advertise = "edge.example"\n'
                "disk_room_mib = 16\n[tls]\ninsecure = true\n")
    args = _broker_args("--config", str(cfg))
    broker = broker_config(args)
    assert (broker.gid, broker.role.value) == ("g7", "slave")
    assert (broker.listen, broker.advertise) == ("0.0.0.0:7000", "10.0.0.2")
    assert (broker.link_listen, broker.link_advertise) == ("0.0.0.0:7443", "edge.example")  # the lean link's
    assert broker_config(_broker_args("--config", str(cfg), "--link-listen", "0.0.0.0:7444")).link_listen == \
        "0.0.0.0:7444"
    assert (broker.zk_hosts, broker.root, broker.zk_session_timeout_s) == ("10.0.0.1:2181,10.0.0.2:2181", "/prod", 3.5)
    assert broker.data_dir == tmp_path / "etc" / "data"  # relative to the file
    assert broker.disk_room_bytes == 16 << 20  # free space that ends a disk-full mark
    assert broker_config(_broker_args("--config", str(cfg), "--disk-room", "0.5")).disk_room_bytes == 1 << 19
    by_default = broker_config(_broker_args("--data", "d", "--group", "g", "--role", "master", "--insecure"))
    assert by_default.disk_room_bytes == 64 << 20
    assert not broker.credentials.tls and args.metrics == "10.0.0.2:9100"  # type: ignore[attr-defined]
    # flags win, the global --zk given after the command too
    args = _broker_args("--config", str(cfg), "--listen", "10.0.0.2:7001", "--role", "master", "--zk", "z:1")
    broker = broker_config(args)
    assert (broker.listen, broker.role.value, broker.zk_hosts) == ("10.0.0.2:7001", "master", "z:1")
    # a seal batch syncs each file unless the data folder's file system is the broker's own
    assert not broker.seal_syncfs
    assert broker_config(_broker_args("--config", str(cfg), "--seal-syncfs")).seal_syncfs


@pytest.mark.parametrize(("text", "says"), [
    ('group = "g1"\nlisen = "1.2.3.4:5"\n', "unknown key 'lisen'"),
    ('group = "g1"\n[tls]\ncertificate = "x"\n', "unknown key 'tls.certificate'"),
    ('group = 7\n', "'group' must be <class 'str'>"),
    ('listen = "no-port"\n', "listen must be HOST:PORT"),
    ('link_listen = "no-port"\n', "link_listen must be HOST:PORT"),
    ('disk_room_mib = -1\n', "disk_room_mib must be a number"),
    ('role = "leader"\n', "'role' must be in"),
    ('listen = "0.0.0.0:7000"\ngroup = "g"\nrole = "master"\ndata = "d"\n[tls]\ninsecure = true\n',
     "needs an advertised address"),
    ('group = "g1"\n', "needs --role, --data"),
    ("group = [\n", "is not valid TOML"),
])
def test_a_bad_config_file_is_refused_naming_the_key(tmp_path: Path, text: str, says: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _toml(tmp_path / "b.toml", text)
    with pytest.raises(ConfigError, match=None) as caught:
        broker_config(_broker_args("--config", str(cfg)))
    assert says in str(caught.value)
    # the command says it in one line and exits 1, before it connects to anything
    assert main(["--zk", "127.0.0.1:1", "broker", "run", "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1, err


def test_zookeeper_and_coordinator_files_are_checked_too(tmp_path: Path) -> None:
    zk = _toml(tmp_path / "zk.toml", 'myid = 2\n[[servers]]\nhost = "a"\n[[servers]]\nhost = "b"\n'
               '[[servers]]\nhost = "c"\nclient_port = 2182\n')
    loaded = process_config.load(zk, process_config.ZkFile)
    assert loaded.node == 1 and [s.client_port for s in loaded.servers] == [2181, 2181, 2182]
    with pytest.raises(ConfigError, match=r"unknown key 'servers\[0\].hots'"):
        process_config.load(_toml(tmp_path / "z2.toml", '[[servers]]\nhots = "a"\n'), process_config.ZkFile)
    with pytest.raises(ConfigError, match="myid: name which of the servers"):
        process_config.load(_toml(tmp_path / "z3.toml", '[[servers]]\nhost = "a"\n' * 3), process_config.ZkFile)
    with pytest.raises(ConfigError, match="unknown key 'group'"):
        process_config.load(_toml(tmp_path / "c.toml", 'group = "g1"\n'), process_config.CoordinatorFile)


def test_cert_register_keeps_the_token_and_zookeeper_credential(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from ordq.common.security import lookup

    zk = f"10.9.9.9:{os.getpid()}"
    register(zk, ROOT, Credentials(token="tok", zk_auth="u:p"), cluster="c1")
    try:
        files = []
        for name in ("c.pem", "c-key.pem", "ca.pem"):
            (tmp_path / name).write_text("x")
            files.append(str(tmp_path / name))
        assert main(["--zk", zk, "cert", "register", "--cert", files[0], "--key", files[1], "--ca", files[2]]) == 0
        got = lookup(zk, ROOT)
        assert (got.cert_file, got.key_file, got.ca_file, got.token, got.zk_auth) == (*files, "tok", "u:p")
        assert not got.zk_tls
        # ``ordq up`` registers TLS to its ZooKeeper: a certificate registered later keeps it
        # (CI: docs/CLI.md's ``ordq group list`` after ``cert register`` could not reach ZooKeeper)
        register(zk, ROOT, Credentials(token="tok", zk_auth="u:p", zk_tls=True, ca_file=files[2], cert_file=files[0],
                                       key_file=files[1]), cluster="c1")
        assert main(["--zk", zk, "cert", "register", "--cert", files[0], "--key", files[1], "--ca", files[2]]) == 0
        assert lookup(zk, ROOT).zk_tls
        capsys.readouterr()
        assert main(["--zk", zk, "cert", "register", "--cert", "nope.pem", "--key", files[1], "--ca", files[2]]) == 1
        assert "nope.pem does not exist" in capsys.readouterr().err
    finally:
        unregister(zk, ROOT)


def test_an_ensemble_across_hosts_is_kept_and_contradictions_refused(tmp_path: Path) -> None:
    from ordq.zk_server import NodeSpec

    specs = [NodeSpec(2181, 2888, 3888, host) for host in (HOST1, HOST2, HOST3)]
    server = ZkServer(tmp_path / "zk", specs=specs, local=[1])
    assert server.connection_string == f"{HOST1}:2181,{HOST2}:2181,{HOST3}:2181"
    assert not server.runs_all and server.local == (1,)
    server._save()  # what start() writes before it starts the node
    server._write_node_files(1)
    cfg = (tmp_path / "zk" / "node1" / "zoo.cfg").read_text()
    assert f"clientPortAddress={HOST2}" in cfg and f"server.3={HOST3}:2888:3888" in cfg
    assert (tmp_path / "zk" / "node1" / "data" / "myid").read_text() == "2\n"
    again = ZkServer.load(tmp_path / "zk")
    assert again.specs == server.specs and again.local == (1,)
    with pytest.raises(ConfigError, match="runs ZooKeeper node"):
        ZkServer(tmp_path / "zk", local=[0])
    with pytest.raises(ConfigError, match="holds a ZooKeeper at"):
        ZkServer(tmp_path / "zk", specs=[NodeSpec(2181, 2888, 3888, h) for h in (HOST1, HOST2, "10.0.0.9")])
    # hosts without ports: free ports picked on each node's own address
    picked = ZkServer(tmp_path / "zk2", nodes=3, hosts=[HOST1, HOST1, HOST2])
    assert [s.host for s in picked.specs] == [HOST1, HOST1, HOST2]
    ports = [p for s in picked.specs[:2] for p in (s.client_port, s.quorum_port, s.election_port)]
    assert len(set(ports)) == 6


def test_the_advertised_address_is_the_listen_host_unless_given() -> None:
    from ordq.broker_group.config import BrokerConfig
    from ordq.broker_group.replica import Role
    from ordq.common.addresses import advertised, split_host_port

    assert advertised("127.0.0.3:0", None, 4711) == "127.0.0.3:4711"
    assert advertised("0.0.0.0:7000", "10.0.0.2", 7000) == "10.0.0.2:7000"
    assert advertised("0.0.0.0:0", "host2.example:9000", 41234) == "host2.example:9000"  # a NAT's port
    assert advertised("[::1]:0", None, 5) == "[::1]:5"
    assert split_host_port("[fd00::2]:7000") == ("[fd00::2]", 7000)
    assert split_host_port("fd00::2", port_optional=True) == ("fd00::2", None)
    for listen, advertise, says in (("0.0.0.0:7000", None, "needs an advertised address"),
                                    ("[::]:7000", None, "needs an advertised address"),
                                    ("10.0.0.2", None, "must be HOST:PORT"),
                                    ("10.0.0.2:70000", None, "port 0..65535"),
                                    ("0.0.0.0:0", "0.0.0.0", "no address a client can dial"),
                                    ("0.0.0.0:0", "10.0.0.2:0", "no address a client can dial")):
        with pytest.raises(ConfigError, match=says):
            advertised(listen, advertise, 1)
        with pytest.raises(ConfigError, match=says):  # refused when built, before anything binds
            BrokerConfig(gid="g", role=Role.MASTER, data_dir=Path("d"), zk_hosts="z:1", listen=listen,
                         advertise=advertise)
