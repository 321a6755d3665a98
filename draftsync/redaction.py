"""Secrets kept out of every message: a URL's password, wherever it sits (user info or query string)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit, urlunsplit

# Query parameters that carry a credential (compared lower-case): libpq's `password`, and the usual token names.
SECRET_PARAMETERS = frozenset({"password", "passwd", "pwd", "secret", "token", "access_token", "api_key", "apikey"})
MASK = "***"


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its user-info password and its secret query parameters' values."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return []
    found += [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if _secret(key) and value]
    return found


def masked_url(url: str) -> str:
    """The URL with every credential replaced by ***, for messages, logs and JSON (unchanged when it has none)."""
    if not url_secrets(url):
        return url
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.partition(':')[0]}:{MASK}@{host}"
    except ValueError:
        return "<unparsable URL>"
    query = "&".join(
        f"{key}={MASK}" if _secret(key) and value else f"{key}={value}"
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def masked_text(text: str, url: str) -> str:
    """`text` (an error from a driver, say) with the credentials `url` carries replaced by ***."""
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def _secret(key: str) -> bool:
    return key.lower() in SECRET_PARAMETERS
