from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from console.api.schema import SchemaView
from console.pages import account, compare, nodes, queue
from console.prometheus import MetricsView
from console.views import favicon

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="registration/login.html", authentication_form=account.LockoutAuthenticationForm),
        name="login",
    ),
    path("account/", include(([path("tokens/", account.tokens, name="tokens")], "account"))),
    path("account/notifications/", include("notify.urls")),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("failover.api_urls")),
    path("api/v1/", include("logs.api_urls")),
    path("api/v1/", include("console.api.urls")),
    path("api/v1/", include("notify.api_urls")),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("nodes/", include(([path("", nodes.node_list, name="list"), path("<str:name>/<str:action>/", nodes.node_action, name="action")], "nodes"))),
    path("queue/", include(([path("", queue.queue_page, name="page")], "queue"))),
    path("compare/", compare.compare, name="compare"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("", include("console.pages.urls")),
    path("favicon.ico", favicon),
]

handler404 = "console.views.not_found"
handler500 = "console.views.server_error"
handler403 = "console.views.forbidden"
handler400 = "console.views.bad_request"
