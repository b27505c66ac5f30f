"""ordq cert ca|issue: a cluster CA, and certificates from it naming where each process is
dialled (docs/OPERATIONS.md, Deploying on three machines; docs/SECURITY.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ordq.commands import add_command, wants_json
from ordq.common import security
from ordq.common.errors import ConfigError
from ordq.common.security import ROLES, Credentials, issue, lookup, make_ca
from ordq.output import emit_json


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "cert", help="make a cluster CA and issue certificates from it")
    sub = parser.add_subparsers(dest="cert_command", metavar="ACTION")
    sub.required = True
    ca = add_command(sub, "ca", func=cmd_ca, help="make a new cluster CA in --out (ca.pem, ca-key.pem 0600)",
                     description="Make a new CA for a cluster: ca.pem (give it to every machine) and ca-key.pem "
                     "(mode 0600; keep it on the machine that issues certificates). Refuses a folder that "
                     "holds one.")
    ca.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder of the CA (made if missing)")
    iss = add_command(sub, "issue", func=cmd_issue,
                      help="issue a certificate from the cluster CA naming the process's addresses",
                      description="Issue a certificate signed by the cluster CA for one process, naming the IP "
                      "addresses (--ip) and DNS names (--dns) it is dialled at: a client dialling it at any "
                      "other name refuses it. Writes DIR/NAME.pem and DIR/NAME-key.pem (created with mode 0600).")
    iss.add_argument("--name", required=True, help="file name of the certificate (NAME.pem, NAME-key.pem)")
    iss.add_argument("--role", choices=sorted(ROLES), default="broker",
                     help="what the process is: its certificate subject and whether it may serve "
                     "(default %(default)s)")
    iss.add_argument("--ip", action="append", default=[], metavar="ADDRESS",
                     help="an IP address the process is dialled at (repeat for several)")
    iss.add_argument("--dns", action="append", default=[], metavar="NAME",
                     help="a DNS name the process is dialled at (repeat for several)")
    iss.add_argument("--ca-dir", type=Path, default=None, metavar="DIR",
                     help="folder of ca.pem and ca-key.pem (default: the folder of the CA registered for --zk)")
    iss.add_argument("--out", type=Path, default=None, metavar="DIR",
                     help="where to write the certificate and key (default: the CA's folder)")
    iss.add_argument("--replace", action="store_true", help="issue again over an existing NAME.pem")
    reg = add_command(sub, "register", func=cmd_register,
                      help="make the CLI and SDK clients on this machine present these files to the cluster at --zk",
                      description="Register a client certificate, its key and the cluster CA for the cluster at "
                      "--zk/--root in this user's credentials file ($ORDQ_CREDENTIALS, else "
                      "~/.config/ordq/credentials.json; docs/SECURITY.md): every ordq command and SDK client "
                      "on this machine then reaches that cluster over mutual TLS with them. With --bootstrap "
                      "HOST:PORT,... (its coordinators' addresses) it also records where they answer, so that "
                      "clients named by --zk/--root find them (clients hold no ZooKeeper session).")
    for flag, what in (("--cert", "the client certificate (ordq cert issue --role client)"), ("--key", "its key"),
                       ("--ca", "the cluster CA (ca.pem)")):
        reg.add_argument(flag, type=Path, required=True, metavar="PEM", help=what)
    reg.add_argument("--zk-tls", action="store_true",
                     help="the cluster's ZooKeeper serves TLS: present the certificate to it too "
                          "(kept when already registered, as by ordq up)")


def cmd_ca(args: argparse.Namespace) -> int:
    ca_pem = make_ca(args.out)
    if wants_json(args):
        emit_json({"ca": str(ca_pem), "key": str(args.out / "ca-key.pem")})
    else:
        print(f"CA made: {ca_pem} (give it to every machine); its key {args.out / 'ca-key.pem'} stays here")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    for f in (args.cert, args.key, args.ca):
        if not f.is_file():
            raise ConfigError(f"{f} does not exist")
    creds = Credentials(ca_file=str(args.ca.absolute()), cert_file=str(args.cert.absolute()),
                        key_file=str(args.key.absolute()), zk_tls=args.zk_tls)
    security.register_tls(args.zk, args.root, creds)
    bootstrap = getattr(args, "bootstrap", None)
    if bootstrap:  # where this cluster's coordinators answer: clients named by --zk/--root find them
        from ordq.coordinator.client import parse_bootstrap

        security.register_coordinators(args.zk, args.root, parse_bootstrap(bootstrap))
    if wants_json(args):
        emit_json({"cluster": f"{args.zk}{args.root}", **creds.to_dict(),
                   "coordinators": security.registered_bootstrap(args.zk, args.root)})
    else:
        print(f"clients of {args.zk}{args.root} on this machine present {args.cert} (CA {args.ca})"
              + (f"; its coordinators: {bootstrap}" if bootstrap else ""))
    return 0


def cmd_issue(args: argparse.Namespace) -> int:
    ca_dir = args.ca_dir
    if ca_dir is None:
        registered = lookup(args.zk, args.root).ca_file
        if registered is None:
            raise ConfigError(f"no CA registered for {args.zk}{args.root}: give --ca-dir DIR "
                              "(make a CA with: ordq cert ca --out DIR)")
        ca_dir = Path(registered).parent
    creds = issue(ca_dir, args.out or ca_dir, args.name, role=args.role, ips=args.ip, dns=args.dns,
                  replace=args.replace)
    if wants_json(args):
        emit_json({"cert": creds.cert_file, "key": creds.key_file, "ca": creds.ca_file, "role": args.role,
                   "ip": args.ip, "dns": args.dns})
    else:
        names = ", ".join([*args.ip, *args.dns]) or "no address"
        print(f"{args.role} certificate for {names}: {creds.cert_file} (key {creds.key_file}, CA {creds.ca_file})")
    return 0
