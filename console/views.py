"""Error pages (a clear message, never a stack trace) and the favicon."""

from __future__ import annotations

from django.shortcuts import redirect, render
from django.templatetags.static import static


def not_found(request, exception=None):
    return render(request, "errors/error.html", {"code": 404, "title": "Not found", "message": "This page does not exist, or you may not see it."}, status=404)


def forbidden(request, exception=None):
    return render(request, "errors/error.html", {"code": 403, "title": "Forbidden", "message": "You may not do this."}, status=403)


def bad_request(request, exception=None):
    return render(request, "errors/error.html", {"code": 400, "title": "Bad request", "message": "The request could not be understood."}, status=400)


def server_error(request):
    return render(
        request,
        "errors/error.html",
        {"code": 500, "title": "Something went wrong", "message": "The error was logged for the operators. Please try again."},
        status=500,
    )


def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links: send them to the console's icon."""
    return redirect(static("console/favicon.svg"), permanent=True)
