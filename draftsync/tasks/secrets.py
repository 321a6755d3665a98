"""Secrets kept in Prefect Secret blocks (the SMTP password, the webhook secret), read where Prefect is allowed.

The packages below `tasks/` know nothing of Prefect: they take a loader (the Mailer's `secret_loader`) or a
resolved value, and this module is what the flows and the webhook receiver hand them.
"""

from __future__ import annotations

from typing import cast

from draftsync.errors import DraftsyncError


def secret_block_value(name: str, what: str = "secret", setting: str | None = None) -> str:
    """The non-empty string in the Prefect Secret block `name`; `what` and `setting` name it in errors."""
    from prefect.blocks.system import Secret

    label = f"{what} block {name!r}" + (f" ({setting})" if setting else "")
    try:
        value = cast(Secret, Secret.load(name)).get()  # async_dispatch: from sync code, the block itself
    except Exception as exc:  # a missing block, an unreachable Prefect API: whatever Prefect raises
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise DraftsyncError(
            f"{label}, a Prefect Secret, cannot be read: {detail}",
            f"create it (Prefect UI: Blocks > Secret, or `Secret(value=...).save({name!r})`) where the Prefect API "
            "this process uses (PREFECT_API_URL) can see it",
        ) from exc
    if not isinstance(value, str):
        raise DraftsyncError(
            f"{label} holds a {type(value).__name__}, not a string",
            "store the secret as the Secret block's plain string value",
        )
    if not value:
        raise DraftsyncError(f"{label} is empty", "store the secret in it (a long random string for a webhook)")
    return value


def smtp_password_block(name: str) -> str:
    """The Mailer's `secret_loader`: the SMTP password from the block DRAFTSYNC_SMTP_PASSWORD_BLOCK names."""
    return secret_block_value(name, "SMTP password", "DRAFTSYNC_SMTP_PASSWORD_BLOCK")
