"""`fedfair pki init | request | sign | issue | show | manifest | revoke`: the certificates folder from the shell.

The flow for a CA held apart from the institutions: each institution runs `request`
(its key never leaves its folder), the CA holder runs `sign` on the request it
receives, and once every certificate is issued anyone runs `manifest` on them; the
institutions compare the printed fingerprints (or the manifest's digest) out of band
and each keeps a copy of the manifest, which pins the roster against the CA itself.
`revoke` writes the next manifest without a certificate (the site removed, or re-keyed) and lists
it as revoked: `manifest --previous` carries that list over and refuses to pin it again; with
`--sign` the CA holder signs a re-key as an update the running federation takes.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

from fedfair.pki.certificates import CA_COMMON_NAME, CA_DAYS, CERT_DAYS
from fedfair.pki.names import ROLES
from fedfair.pki.roster import Roster, pins_from_folders, write_manifest
from fedfair.core.errors import ConfigError
from fedfair.pki.store import (
    ca_paths,
    describe,
    init_ca,
    issue,
    load_certificate,
    load_private_key,
    request_certificate,
    sign_certificate,
)
from fedfair.pki.verification import (
    fingerprint,
    name_from_certificate,
    role_of_certificate,
)


def _cmd_init(args: argparse.Namespace) -> int:
    path = init_ca(args.dir, common_name=args.common_name, days=args.days)
    print(f"created the CA: {path} and {path.with_suffix('.key')} (keep ca.key secret; share ca.crt)")
    return 0


def _cmd_request(args: argparse.Namespace) -> int:
    key_path, csr_path = request_certificate(args.dir, args.name, args.role)
    print(f"wrote {key_path} (0600, stays here) and {csr_path} (asks for the {args.role} role)")
    print(f"next: send {csr_path.name} to the CA holder; put the returned {args.name}.crt and ca.crt in {args.dir}")
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    path = sign_certificate(
        args.dir, args.csr, args.role, days=args.days, hosts=args.host, overwrite=args.force, out=args.out
    )
    certificate = load_certificate(path)
    name = name_from_certificate(certificate)
    print(f"issued {path} for {name} ({role_of_certificate(certificate)}), sha256 {fingerprint(certificate)}")
    print(f"next: send {path.name} and ca.crt back to {name}")
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    path = issue(args.dir, args.role, args.name, days=args.days, hosts=args.host)
    print(f"issued {path} and {path.with_suffix('.key')} (0600) for {args.name} ({args.role})")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    for line in describe(args.dir, args.name):
        print(line)
    return 0


def _cmd_manifest(args: argparse.Namespace) -> int:
    ca_certificate = load_certificate(args.ca) if args.ca is not None else None
    pins = pins_from_folders(args.certs, ca_certificate)
    revoked: tuple[str, ...] = ()
    if args.previous is not None:
        from fedfair.runtime.manifest import load_manifest

        revoked = load_manifest(args.previous).revoked
    roster = Roster(args.federation, tuple(pins), args.max_colluding, args.min_round_size, revoked=revoked)
    digest = write_manifest(args.out, roster)
    print(f"wrote {args.out} for federation {args.federation}: {len(pins)} participants")
    if revoked:
        print(f"  {len(revoked)} revoked certificate(s) carried over from {args.previous}, none of them pinned")
    elif args.previous is None:
        print("  made from the certificates alone: if an earlier manifest revoked one, pass it with --previous")
    for pin in sorted(pins, key=lambda pin: (pin.role != "aggregator", pin.name)):
        print(f"  {pin.name:<20} {pin.role:<12} sha256 {pin.sha256}")
    print(f"manifest sha256 {digest}")
    print("next: every institution compares these fingerprints (or the digest) out of band, then keeps a copy")
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    from fedfair.pki.roster import pin_certificate
    from fedfair.runtime.manifest import load_manifest, manifest_digest, revoked
    from fedfair.runtime.manifest_update import signed_update, write_update

    manifest = load_manifest(args.manifest)
    old = manifest.pin(args.name)
    replacement = None
    if args.replace is not None:
        ca = load_certificate(args.ca if args.ca is not None else args.replace.parent / "ca.crt")
        replacement = pin_certificate(load_certificate(args.replace), ca)
    elif args.sign is not None:
        raise ConfigError(
            "--sign writes an update a running federation takes, which only re-keys a site: add --replace NEW.crt, "
            "or drop --sign to remove the site (a new federation)"
        )
    new = dataclasses.replace(revoked(manifest, args.name, replacement, args.min_round_size), source=args.out)
    if args.sign is not None:
        write_update(args.out, signed_update(manifest, new, load_private_key(ca_paths(args.sign)[1])))
    else:
        write_manifest(args.out, new.roster)
    print(f"wrote {args.out}: the certificate of {args.name} (sha256 {old.sha256 if old else '?'}) is revoked")
    if replacement is not None:
        print(f"  {args.name} is pinned to its new certificate, sha256 {replacement.sha256}; the plan stays pinned")
    if args.sign is not None:
        print(f"  signed by the CA holder as the update of manifest {manifest_digest(manifest)}")
        print(f"next: every institution compares the digest and puts {args.out} in place of {args.manifest} (the")
        print("aggregator too) while the federation runs: each checks the signature and the chain, and from its")
        print("next round refuses the revoked certificate; the re-keyed site restarts on its new certificate")
    elif replacement is not None:
        print(f"next: every institution compares the digest, puts {args.out} in place of {args.manifest}, and the")
        print("aggregator is started again with it: the revoked certificate is refused at its handshake and by")
        print("every peer's key agreement (to do this while the federation runs, add --sign CA_FOLDER)")
    elif old is not None and old.role == "auditor":
        print(f"  {len(new.auditors)} auditors left; no plan pinned")
        print(
            f"next: pin the plan again (`fedfair plan pin --manifest {args.out}`); a plan whose input bound named "
            f"{args.name} is refused until it names another auditor"
        )
    else:
        print(f"  {len(new.collaborators)} collaborators left, min_round_size {new.min_round_size}; no plan pinned")
        print(
            f"next: remove {args.name} from the plan's [federation] collaborators (and its [influence] size), then "
            f"`fedfair plan renew --plan PLAN --manifest {args.out} --federation NEW_ID --out NEW_MANIFEST`; every "
            "site's privacy ledger continues (it is its data's, not the federation's)"
        )
    print(f"manifest sha256 {manifest_digest(new)}")
    return 0


def _add_certificate_arguments(parser: argparse.ArgumentParser, *, role_required: bool) -> None:
    """What `sign` and `issue` both ask of the certificate they make: role, validity, extra hosts."""
    if role_required:
        parser.add_argument("--role", choices=ROLES, required=True)
    else:
        parser.add_argument(
            "--role", choices=ROLES, default=None, help="the role to sign for (default: the one the request asks for)"
        )
    parser.add_argument("--days", type=int, default=CERT_DAYS, help=f"validity (default {CERT_DAYS})")
    parser.add_argument(
        "--host", action="append", default=[], help="extra DNS name or IP in the certificate (repeatable)"
    )


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedfair pki {init,request,sign,issue,show,manifest,revoke}``."""
    pki = subparsers.add_parser("pki", help="certificates: a CA per federation, one certificate per participant")
    commands = pki.add_subparsers(dest="pki_command", required=True, metavar="STEP")

    def add(
        name: str,
        help_text: str,
        handler: Callable[[argparse.Namespace], int],
        folder: tuple[str, ...] | None = ("--dir",),
        folder_help: str = "the certificates folder",
    ) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text)
        if folder is not None:
            parser.add_argument(*folder, dest="dir", type=Path, required=True, help=folder_help)
        parser.set_defaults(handler=handler)
        return parser

    init = add("init", "create the federation's CA (ca.crt, ca.key)", _cmd_init)
    init.add_argument("--days", type=int, default=CA_DAYS, help=f"validity (default {CA_DAYS})")
    init.add_argument("--common-name", default=CA_COMMON_NAME, help="the CA's subject name")

    request = add(
        "request",
        "at an institution: make NAME.key (stays) and NAME.csr (travels to the CA holder)",
        _cmd_request,
        ("--out", "--dir"),
        "the institution's own certificates folder",
    )
    request.add_argument("--name", required=True, help="the participant name, e.g. hospital-a")
    request.add_argument(
        "--role", choices=ROLES, default="collaborator", help="the role asked for (default collaborator)"
    )

    sign = add(
        "sign",
        "at the CA: check NAME.csr and issue NAME.crt",
        _cmd_sign,
        ("--ca", "--dir"),
        "the CA's folder (ca.crt, ca.key)",
    )
    sign.add_argument("--csr", type=Path, required=True, help="the signing request to check and sign")
    sign.add_argument("--out", type=Path, default=None, help="where to write the certificate (default CA/NAME.crt)")
    sign.add_argument("--force", action="store_true", help="replace an existing certificate (renewal)")
    _add_certificate_arguments(sign, role_required=False)

    issuing = add("issue", "request and sign in one folder (local demos)", _cmd_issue)
    issuing.add_argument("--name", required=True, help="the participant name, e.g. hospital-a")
    _add_certificate_arguments(issuing, role_required=True)

    show = add("show", "list the CA and certificates with role, expiry and status", _cmd_show)
    show.add_argument("--name", default=None, help="only this participant")

    manifest = add(
        "manifest",
        "build the federation's manifest (pinned roster) from the issued certificates",
        _cmd_manifest,
        folder=None,
    )
    manifest.add_argument("--federation", required=True, help="the federation id, as in the plan")
    manifest.add_argument(
        "--certs", type=Path, nargs="+", action="extend", required=True, help="folders holding the NAME.crt files"
    )
    manifest.add_argument(
        "--ca", type=Path, default=None, help="the federation's ca.crt (default: the one the folders hold)"
    )
    manifest.add_argument(
        "--max-colluding", type=int, default=0, help="collaborators that may collude with the aggregator (default 0)"
    )
    manifest.add_argument("--min-round-size", type=int, required=True, help="the fewest parties a round may have")
    manifest.add_argument("--out", type=Path, required=True, help="the manifest to write, e.g. manifest.toml")
    manifest.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="the federation's last manifest: its revoked certificates carry over and are refused if found again",
    )

    revoke = add(
        "revoke",
        "write a new manifest without a collaborator's certificate (removed, or replaced by a new one)",
        _cmd_revoke,
        folder=None,
    )
    revoke.add_argument("--manifest", type=Path, required=True, help="the manifest in force")
    revoke.add_argument("--name", required=True, help="the collaborator whose certificate is revoked")
    revoke.add_argument("--out", type=Path, required=True, help="the new manifest to write (never over a file)")
    revoke.add_argument(
        "--replace", type=Path, default=None, help="the institution's new NAME.crt to pin instead (a new key)"
    )
    revoke.add_argument(
        "--ca", type=Path, default=None, help="the federation's ca.crt (default: the one beside --replace)"
    )
    revoke.add_argument(
        "--min-round-size", type=int, default=None, help="a lower bound, when the roster left is below the old one"
    )
    revoke.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="CA_FOLDER",
        help="sign the new manifest with the CA key there, as an update a running federation takes (with --replace)",
    )
