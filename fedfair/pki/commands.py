"""`fedfair pki init | request | sign | issue | show`: the certificates folder from the shell."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from fedfair.pki.certificates import CA_COMMON_NAME, CA_DAYS, CERT_DAYS
from fedfair.pki.names import ROLES
from fedfair.pki.store import (
    describe,
    init_ca,
    issue,
    load_certificate,
    request_certificate,
    sign_certificate,
)
from fedfair.pki.verification import fingerprint


def _cmd_init(args: argparse.Namespace) -> int:
    path = init_ca(args.dir, common_name=args.common_name, days=args.days)
    print(f"created the CA: {path} and {path.with_suffix('.key')} (keep ca.key secret; share ca.crt)")
    return 0


def _cmd_request(args: argparse.Namespace) -> int:
    key_path, csr_path = request_certificate(args.dir, args.name)
    print(f"wrote {key_path} (0600, stays here) and {csr_path}")
    print(f"next: send {csr_path.name} to the CA operator; put the returned {args.name}.crt and ca.crt in {args.dir}")
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    path = sign_certificate(args.dir, args.csr, args.role, days=args.days, hosts=args.host, overwrite=args.force)
    certificate = load_certificate(path)
    print(f"issued {path} for {path.stem} ({args.role}), sha256 {fingerprint(certificate)}")
    print(f"next: send {path.name} and ca.crt back to {path.stem}")
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    path = issue(args.dir, args.role, args.name, days=args.days, hosts=args.host)
    print(f"issued {path} and {path.with_suffix('.key')} (0600) for {args.name} ({args.role})")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    for line in describe(args.dir, args.name):
        print(line)
    return 0


def _add_certificate_arguments(parser: argparse.ArgumentParser) -> None:
    """What `sign` and `issue` both ask of the certificate they make: role, validity, extra hosts."""
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--days", type=int, default=CERT_DAYS, help=f"validity (default {CERT_DAYS})")
    parser.add_argument(
        "--host", action="append", default=[], help="extra DNS name or IP in the certificate (repeatable)"
    )


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedfair pki {init,request,sign,issue,show}``."""
    pki = subparsers.add_parser("pki", help="certificates: a CA per federation, one certificate per participant")
    commands = pki.add_subparsers(dest="pki_command", required=True, metavar="STEP")

    def add(
        name: str, help_text: str, handler: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--dir", type=Path, required=True, help="the certificates folder")
        parser.set_defaults(handler=handler)
        return parser

    init = add("init", "create the federation's CA (ca.crt, ca.key)", _cmd_init)
    init.add_argument("--days", type=int, default=CA_DAYS, help=f"validity (default {CA_DAYS})")
    init.add_argument("--common-name", default=CA_COMMON_NAME, help="the CA's subject name")

    request = add("request", "at an institution: make NAME.key (stays) and NAME.csr (travels)", _cmd_request)
    request.add_argument("--name", required=True, help="the participant name, e.g. hospital-a")

    sign = add("sign", "at the CA: check NAME.csr and issue NAME.crt", _cmd_sign)
    sign.add_argument("--csr", type=Path, required=True, help="the signing request to check and sign")
    sign.add_argument("--force", action="store_true", help="replace an existing NAME.crt (renewal)")
    _add_certificate_arguments(sign)

    issuing = add("issue", "request and sign in one folder (local demos)", _cmd_issue)
    issuing.add_argument("--name", required=True, help="the participant name, e.g. hospital-a")
    _add_certificate_arguments(issuing)

    show = add("show", "list the CA and certificates with role, expiry and status", _cmd_show)
    show.add_argument("--name", default=None, help="only this participant")
