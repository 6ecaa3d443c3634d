"""The account menu's Notifications page: the user's subscriptions, a form to add one (checked
by the API's own serializer, so the page and the API accept the same), deletion, each
subscription's latest deliveries and asking again for a confirmation link; and the page that
link opens (no sign-in: whoever holds the mailbox confirms it)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from jobs.models import Project
from notify import handoff, verification
from notify.api import SubscriptionSerializer
from notify.models import Kind, Subscription


def form_data(post) -> dict:
    scope = post.get("scope", "mine")
    data = {
        "channel": post.get("channel", ""),
        "email": post.get("email", "").strip(),
        "url": post.get("url", "").strip(),
        "slack": post.get("slack") == "on",
        "kinds": post.getlist("kinds") or list(Kind.values),
    }
    if scope == "project":
        data["project"] = post.get("project") or None
    elif scope == "job":
        data["job"] = post.get("job", "").strip() or None
    return data


@login_required
def subscriptions(request: HttpRequest) -> HttpResponse:
    mine = Subscription.objects.filter(user_id=request.user.pk or 0).select_related("project")
    errors: dict = {}
    values: dict = {}
    if request.method == "POST":
        if request.POST.get("delete"):
            deleted, _ = mine.filter(pk=request.POST["delete"] if request.POST["delete"].isdigit() else 0).delete()
            messages.success(request, "Subscription deleted." if deleted else "No such subscription.")
            return redirect("notify:subscriptions")
        if request.POST.get("resend"):
            resend_confirmation(request, mine)
            return redirect("notify:subscriptions")
        values = form_data(request.POST)
        serializer = SubscriptionSerializer(data=values, context={"request": request})
        if serializer.is_valid():
            created = serializer.save(user=request.user)
            messages.success(request, f"Subscribed: {created.target} hears of {', '.join(created.kinds)} for {created.scope}.")
            if created.awaiting_verification:
                messages.info(request, f"A confirmation link is on its way to {created.email}: nothing is sent there until it is opened.")
            return redirect("notify:subscriptions")
        errors = {field: " ".join(str(e) for e in problems) for field, problems in serializer.errors.items()}
    rows = [(s, list(s.deliveries.select_related("event").order_by("-created_at", "-id")[:5])) for s in mine]
    return render(
        request,
        "notify/subscriptions.html",
        {
            "rows": rows,
            "errors": errors,
            "values": values,
            "kinds": Kind.choices,
            "projects": Project.objects.for_user(request.user).order_by("name"),
            "nav": "notifications",
        },
    )


def resend_confirmation(request: HttpRequest, mine) -> None:
    pk = request.POST["resend"]
    subscription = mine.filter(pk=pk if pk.isdigit() else 0).first()
    if subscription is None or not subscription.awaiting_verification:
        messages.error(request, "No subscription of yours waits for a confirmation.")
        return
    refused = verification.refusal(int(request.user.pk or 0), subscription)
    if refused:
        messages.error(request, refused)
        return
    handoff.confirmation_requested(subscription)
    messages.success(request, f"A new confirmation link is on its way to {subscription.email}.")


def confirm(request: HttpRequest, token: str) -> HttpResponse:
    subscription = verification.confirm(token)
    return render(request, "notify/confirmed.html", {"subscription": subscription}, status=200 if subscription else 400)
