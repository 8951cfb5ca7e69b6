"""`fencepost keys new`: a CURVE key pair for one member or client of a secure cluster (docs/security.md).

Like every command module, it only parses options and calls the packages (``election.secure.keys``).
"""

from __future__ import annotations

from pathlib import Path

import click

from commands.output import emit
from election.secure.keys import ROLES, new_key_pair, write_key_pair


@click.group("keys")
def keys_group() -> None:
    """CURVE keys and roles of a secure cluster."""


@keys_group.command("new")
@click.option(
    "--role",
    required=True,
    type=click.Choice(ROLES),
    help="What the key may do: producer (submit, get, cancel), worker (lease, heartbeat, complete, "
    "fail), admin (everything), broker, bookie (cluster members).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for NAME.secret (mode 0600) and NAME.public.",
)
@click.option("--name", default=None, help="The key's name in the keys file and in logs [default: the role].")
@click.option("--json", "as_json", is_flag=True, help="Print the paths and the public line as JSON.")
def keys_new(role: str, out_dir: str, name: str | None, as_json: bool) -> None:
    """Make a CURVE key pair: NAME.secret (keep it on the one machine that uses it) and NAME.public.

    Add the line in NAME.public to the cluster's keys file (--keys-file) on every
    server, then send the servers SIGHUP to admit the key without a restart.
    Existing files are never overwritten.
    """
    pair = new_key_pair(role, name or role)
    secret, public = write_key_pair(pair, Path(out_dir))
    emit(
        {
            "role": pair.role,
            "name": pair.name,
            "secret_file": str(secret),
            "public_file": str(public),
            "public_line": pair.public_line(),
        },
        as_json,
        lambda r: click.echo(
            f"wrote {r['secret_file']} (mode 0600) and {r['public_file']}; add this line to the "
            f"keys file:\n{r['public_line']}"
        ),
    )
