"""The account menu's pages: signing in (with the lock-out) and the user's API tokens."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from knox.models import AuthToken
from knox.settings import knox_settings

from console import lockout


class LockoutAuthenticationForm(AuthenticationForm):
    """Django's sign-in form, refusing a username or a client address locked after repeated
    failures."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = lockout.client_address(self.request)
        refused = lockout.refusal(username, address)
        if refused:
            raise forms.ValidationError(refused, code="locked")
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            if username:
                lockout.record_failure(username, address)
            raise
        lockout.record_success(username)
        return cleaned


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    """List the user's API tokens (never the tokens themselves: only their first characters are
    stored in clear), create one (shown once), revoke one or all."""
    mine = AuthToken.objects.filter(user=request.user)
    new_token = None
    if request.method == "POST":
        target = request.POST.get("revoke", "")
        if request.POST.get("create"):
            _instance, new_token = AuthToken.objects.create(request.user, expiry=knox_settings.TOKEN_TTL)
            messages.success(request, "Token created: copy it now, it is not shown again.")
        elif target == "all":
            count, _ = mine.delete()
            messages.success(request, f"Revoked {count} token{'s' if count != 1 else ''}.")
            return redirect("account:tokens")
        elif target:
            count, _ = mine.filter(token_key=target[:15]).delete()
            messages.success(request, "Token revoked." if count else "No such token.")
            return redirect("account:tokens")
    return render(
        request,
        "account/tokens.html",
        {"tokens": mine.order_by("-created"), "new_token": new_token, "ttl_days": knox_settings.TOKEN_TTL.days, "nav": "tokens"},
    )
