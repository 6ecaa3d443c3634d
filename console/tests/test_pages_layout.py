"""The base layout, login and logout, the error page, and the console's own static files."""

from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_header_names_the_product_the_user_and_offers_logout(login, owner):
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "Simple AI Training" in html
    assert 'aria-current="page">Training Jobs</a>' in html
    assert '<span class="topbar__username" title="Signed in as owner">owner</span>' in html
    assert f'<form method="post" action="{reverse("logout")}">' in html
    assert ">Admin</a>" not in html


def test_staff_see_an_admin_link(login, staff):
    html = login(staff).get(reverse("jobs:list")).content.decode()
    assert f'<a href="{reverse("admin:index")}">Admin</a>' in html


def test_every_page_loads_the_stylesheet_and_icons_from_the_app(login, owner):
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert 'href="/static/console/console.css"' in html
    assert 'src="/static/console/console.js"' in html
    assert '<symbol id="icon-clock"' in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html


@pytest.mark.parametrize("path", ["/static/console/console.css", "/static/console/console.js", "/static/console/favicon.svg"])
def test_the_static_files_are_served(client, path):
    response = client.get(path)
    assert response.status_code == 200
    response.close()


def test_the_login_page_has_labelled_fields(client):
    response = client.get(reverse("login"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'for="id_username"' in html and 'for="id_password"' in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert "Log out" not in html


def test_signing_in_leads_to_the_job_list(client, owner):
    response = client.post(reverse("login"), {"username": "owner", "password": "owner-pass-1"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("jobs:list")
    assert "Training Jobs" in response.content.decode()


def test_a_wrong_password_is_reported_on_the_login_page(client, owner):
    response = client.post(reverse("login"), {"username": "owner", "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password." in response.content.decode()


def test_signing_in_returns_to_the_page_asked_for(client, owner):
    response = client.post(reverse("login"), {"username": "owner", "password": "owner-pass-1", "next": reverse("jobs:create")})
    assert response["Location"] == reverse("jobs:create")


def test_logging_out_ends_the_session(login, owner):
    client = login(owner)
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert client.get(reverse("jobs:list")).status_code == 302


def test_the_error_page_renders_for_anonymous_users(client):
    response = client.get("/no-such-page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "Not found" in html and "404" in html
    assert "Simple AI Training" in html


def test_the_error_page_renders_for_signed_in_users(login, owner):
    response = login(owner).get(reverse("jobs:detail", args=[999]))
    assert response.status_code == 404
    assert "Back to Training Jobs" in response.content.decode()


def test_the_server_error_page_renders_without_a_stack_trace(rf):
    from django.contrib.auth.models import AnonymousUser

    from console.views import server_error

    request = rf.get("/")
    request.user = AnonymousUser()
    response = server_error(request)
    assert response.status_code == 500
    assert "Something went wrong" in response.content.decode()
