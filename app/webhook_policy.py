"""Webhook policy, shared by admission and the sender: which URLs a swarm may name (checked at
creation: absolute, https unless allowed, no credentials, a public address unless allowed —
no SSRF), which secret signs a tenant's deliveries, and the signature receivers verify."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

from app.config import Settings
from app.errors import Refused
from app.outbound import resolve_public

SIGNATURE_HEADER = "X-Swarm-Signature"


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """`t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`, as receivers verify it."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def webhook_secret(settings: Settings, tenant: str,
                   secrets: Mapping[str, str] | None = None) -> str:
    """The key that signs `tenant`'s webhooks: its own (`secrets`, else the `webhook_secret`
    of its table in SWARM_TENANTS_FILE), else SWARM_WEBHOOK_SECRET."""
    if secrets is not None:
        own = secrets.get(tenant)
    else:
        limit = settings.tenant_limits(tenant).webhook_secret
        own = limit.get_secret_value() if limit is not None else None
    return own or settings.webhook_secret.get_secret_value()


def send_refusal(url: str, settings: Settings, secret: str) -> str | None:
    """Why a delivery must not be sent now (None: it may), beside the address check made as
    it connects: the policy in force at the send, not only at creation — a secret removed
    since (a delivery signed with an empty key anyone can forge), http no longer allowed."""
    if not secret:
        return "no webhook secret is configured (SWARM_WEBHOOK_SECRET or the tenant's): not sent"
    if urlsplit(url).scheme not in _schemes(settings):
        return "http webhooks are not allowed (SWARM_WEBHOOK_ALLOW_HTTP): not sent"
    return None


def _schemes(settings: Settings) -> set[str]:
    return {"https", "http"} if settings.webhook_allow_http else {"https"}


def _invalid(message: str, url: str) -> Refused:
    return Refused(message, code="invalid_webhook_url",
                   details={"field": "webhook_url", "url": url})


async def check_webhook_url(url: str, settings: Settings, tenant: str = "",
                            secrets: Mapping[str, str] | None = None) -> None:
    """Reject at creation what could never be delivered, or must not be (SSRF)."""
    if not webhook_secret(settings, tenant, secrets):
        raise Refused("webhooks need SWARM_WEBHOOK_SECRET (or the tenant's webhook_secret) on "
                      "the server", code="webhooks_not_configured",
                      details={"field": "webhook_url"})
    try:
        parts = urlsplit(url)
        hostname, port = parts.hostname, parts.port
        # what the sender parses: it refuses some of what urlsplit passes (a control
        # character, a malformed IPv6 literal), which would then never be sent
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL):  # a bad port or IPv6 literal
        raise _invalid("webhook_url is not a valid URL", url) from None
    allowed = _schemes(settings)
    if parts.scheme not in allowed or not hostname:
        raise _invalid(f"webhook_url must be an absolute {' or '.join(sorted(allowed))} URL", url)
    if parts.username or parts.password:
        raise _invalid("webhook_url must not carry credentials", url)
    if not settings.webhook_allow_private:
        try:
            await resolve_public(hostname, port or (443 if parts.scheme == "https" else 80))
        except ValueError as exc:
            raise _invalid(str(exc), url) from exc
