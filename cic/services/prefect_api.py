"""Whether the Prefect API a command will use answers, checked in seconds before any flow starts.

With `PREFECT_API_URL` set (a team's server), a flow call on a dead address fails only after Prefect's client
retries, with three tracebacks; this probe turns that into one line naming the address and the fix. Without
it, Prefect starts its own ephemeral API and there is nothing to check.
"""

from __future__ import annotations

from cic.errors import ServiceDown


def configured_api_url() -> str | None:
    """The API URL Prefect's settings name (environment or profile), or None for an ephemeral API."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def check_prefect_api(timeout_s: float = 5.0) -> None:
    """Refuse, within `timeout_s`, a configured Prefect API where nothing answers its health check."""
    import httpx

    url = configured_api_url()
    if url is None:
        return
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ServiceDown(f"PREFECT_API_URL = {url!r}: the Prefect API does not answer within {timeout_s:g} s "
                          f"({type(exc).__name__}: {exc}); start it (`prefect server start`), fix the URL, or unset "
                          "PREFECT_API_URL to run on an ephemeral API") from None
