"""`fencepost keys new`: a CURVE key pair for one member or client of a secure cluster, or an API key
for the HTTP API (`--api NAME`) (docs/security.md).

Like every command module, it only parses options and calls the packages (``election.secure.keys``,
``election.secure.api_keys``).
"""

from __future__ import annotations

from pathlib import Path

import click

from commands.output import emit
from election.secure.api_keys import API_ROLES, add_api_key, write_key_file
from election.secure.keys import ROLES, new_key_pair, write_key_pair


@click.group("keys")
def keys_group() -> None:
    """CURVE keys and roles of a secure cluster; API keys of the HTTP API."""


@keys_group.command("new")
@click.option(
    "--role",
    required=True,
    type=click.Choice(ROLES),
    help="What the key may do: producer (submit, get, cancel), worker (lease, heartbeat, complete, "
    "fail), admin (everything), broker, bookie (cluster members; not for --api).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Directory for NAME.secret (mode 0600) and NAME.public; with --api, for NAME.apikey (mode "
    "0600) [required without --api; with --api, default: the key is printed once].",
)
@click.option("--name", default=None, help="The key's name in the keys file and in logs [default: the role].")
@click.option(
    "--api",
    "api_name",
    default=None,
    metavar="NAME",
    help="Make an API key named NAME for the HTTP API (`fencepost api`) instead of a CURVE key pair: "
    "its hash and role are appended to --api-keys-file.",
)
@click.option(
    "--api-keys-file",
    default=None,
    envvar="FENCEPOST_API_KEYS_FILE",
    type=click.Path(dir_okay=False),
    help="With --api: the API keys file to add the key to (created mode 0600 if missing) "
    "[env FENCEPOST_API_KEYS_FILE].",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the paths and the public line (or the API key) as JSON."
)
def keys_new(
    role: str,
    out_dir: str | None,
    name: str | None,
    api_name: str | None,
    api_keys_file: str | None,
    as_json: bool,
) -> None:
    """Make a CURVE key pair: NAME.secret (keep it on the one machine that uses it) and NAME.public.

    Add the line in NAME.public to the cluster's keys file (--keys-file) on every
    server, then send the servers SIGHUP to admit the key without a restart.
    Existing files are never overwritten.

    With --api NAME: an API key for `fencepost api`, sent as `Authorization: Bearer KEY`. Only its
    SHA-256 goes into --api-keys-file (the running API servers see it within a second); the key
    itself is written to --out/NAME.apikey, or printed once when --out is not given.
    """
    if api_name is not None:
        _new_api_key(role, api_name, name, out_dir, api_keys_file, as_json)
        return
    if out_dir is None:
        raise click.UsageError("--out is required (the directory for NAME.secret and NAME.public)")
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


def _new_api_key(
    role: str, api_name: str, name: str | None, out_dir: str | None, api_keys_file: str | None, as_json: bool
) -> None:
    if name is not None:
        raise click.UsageError("--api NAME names the API key: give no --name with it")
    if role not in API_ROLES:
        raise click.UsageError(f"an API key's role is one of {', '.join(API_ROLES)}, not {role}")
    if api_keys_file is None:
        raise click.UsageError("--api needs --api-keys-file (or FENCEPOST_API_KEYS_FILE)")
    key_path = Path(out_dir) / f"{api_name}.apikey" if out_dir else None
    if key_path is not None and key_path.exists():
        raise click.UsageError(f"{key_path} exists: keys are never overwritten")
    key = add_api_key(Path(api_keys_file), role, api_name)
    result = {"role": role, "name": api_name, "api_keys_file": str(api_keys_file)}
    if key_path is not None:
        result["key_file"] = str(write_key_file(key, key_path))
    else:
        result["key"] = key

    def human(r: dict) -> None:
        where = (
            f"the key is in {r['key_file']} (mode 0600)"
            if "key_file" in r
            else f"the key (shown once): {r['key']}"
        )
        click.echo(f"added API key {r['name']} ({r['role']}) to {r['api_keys_file']}; {where}")

    emit(result, as_json, human)
